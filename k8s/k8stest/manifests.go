package k8stest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// WebhookManifests reads the webhook configurations the project ships
// (deploy/k8s/webhook.yaml), strictly: an unknown field is an error.
func WebhookManifests() (*admissionregv1.ValidatingWebhookConfiguration, *admissionregv1.MutatingWebhookConfiguration, error) {
	path := filepath.Join(repoDir(), "deploy", "k8s", "webhook.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	vwc := &admissionregv1.ValidatingWebhookConfiguration{}
	mwc := &admissionregv1.MutatingWebhookConfiguration{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch tm.Kind {
		case "ValidatingWebhookConfiguration":
			err = yaml.UnmarshalStrict([]byte(doc), vwc)
		case "MutatingWebhookConfiguration":
			err = yaml.UnmarshalStrict([]byte(doc), mwc)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("webhook.yaml: %w", err)
		}
	}
	return vwc, mwc, nil
}
