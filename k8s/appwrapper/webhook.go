package appwrapper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	authv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	authclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// QueueNameLabel is Kueue's queue label, which the defaulting webhook adds
// with Config.DefaultQueueName when an AppWrapper names none.
const QueueNameLabel = "kueue.x-k8s.io/queue-name"

// maxPodSets is Kueue's limit on the pod sets of one workload.
const maxPodSets = 8

// Webhook is the admission webhook of AppWrappers, with upstream's checks
// (project-codeflare/appwrapper 1.2.1, internal/webhook):
//
//   - defaulting: the default queue label when none is set;
//   - on create: no nested AppWrapper; no object in another namespace; with
//     userRBACAdmissionCheck, a SubjectAccessReview per component, so that
//     the requesting user may create each wrapped object directly (without
//     it, whoever may create AppWrappers may create anything the
//     controller's ClusterRole can: a privilege escalation inside the
//     namespace); every declared pod set's path leads to a pod template and
//     agrees with the kind's own; 1 to 8 pod sets in all (Kueue);
//   - on update: the components (templates, pod set paths and replicas) and
//     spec.managedBy are immutable.
type Webhook struct {
	cfg  Config
	sar  authclient.SubjectAccessReviewInterface
	disc discovery.DiscoveryInterface

	mu        sync.Mutex
	resources map[schema.GroupVersionKind]string // kind -> resource, from discovery
}

// SetupWebhookWithManager registers the defaulting and validating webhooks
// of AppWrappers on mgr's webhook server, at controller-runtime's paths
// (/mutate-workload-codeflare-dev-v1beta2-appwrapper and
// /validate-workload-codeflare-dev-v1beta2-appwrapper, as upstream's).
func SetupWebhookWithManager(mgr ctrl.Manager, cfg Config) error {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("appwrapper webhook: client: %w", err)
	}
	w := &Webhook{cfg: cfg, sar: cs.AuthorizationV1().SubjectAccessReviews(), disc: cs.Discovery(),
		resources: map[schema.GroupVersionKind]string{}}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1beta2.AppWrapper{}).
		WithDefaulter(w).
		WithValidator(w).
		Complete(); err != nil {
		return fmt.Errorf("appwrapper webhook: %w", err)
	}
	return nil
}

// Default adds the default queue label.
func (w *Webhook) Default(_ context.Context, aw *v1beta2.AppWrapper) error {
	if q := w.cfg.DefaultQueueName; q != "" && aw.Labels[QueueNameLabel] == "" {
		if aw.Labels == nil {
			aw.Labels = map[string]string{}
		}
		aw.Labels[QueueNameLabel] = q
	}
	return nil
}

// ValidateCreate applies the create checks (see Webhook).
func (w *Webhook) ValidateCreate(ctx context.Context, aw *v1beta2.AppWrapper) (admission.Warnings, error) {
	return nil, w.validateCreate(ctx, aw).ToAggregate()
}

// ValidateUpdate refuses a change of the components or of spec.managedBy.
func (w *Webhook) ValidateUpdate(_ context.Context, old, aw *v1beta2.AppWrapper) (admission.Warnings, error) {
	return nil, validateUpdate(old, aw).ToAggregate()
}

// ValidateDelete allows every deletion.
func (w *Webhook) ValidateDelete(context.Context, *v1beta2.AppWrapper) (admission.Warnings, error) {
	return nil, nil
}

func (w *Webhook) validateCreate(ctx context.Context, aw *v1beta2.AppWrapper) field.ErrorList {
	var errs field.ErrorList
	comps := field.NewPath("spec", "components")
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return field.ErrorList{field.InternalError(comps, err)}
	}
	podSets := 0
	for i, c := range aw.Spec.Components {
		path := comps.Index(i).Child("template")
		obj, err := DecodeTemplate(c.Template)
		if err != nil {
			errs = append(errs, field.Invalid(path, "", err.Error()))
			continue
		}
		gvk := obj.GroupVersionKind()
		if gvk.Group == v1beta2.GroupVersion.Group && gvk.Kind == "AppWrapper" {
			errs = append(errs, field.Forbidden(path, "nested AppWrappers are forbidden"))
		}
		if ns := obj.GetNamespace(); ns != "" && ns != aw.Namespace {
			errs = append(errs, field.Forbidden(path.Child("metadata", "namespace"),
				fmt.Sprintf("AppWrappers cannot create objects in other namespaces (%q, the AppWrapper's is %q)", ns, aw.Namespace)))
		}
		if w.cfg.UserRBACAdmissionCheck {
			if err := w.authorize(ctx, req, aw.Namespace, gvk); err != nil {
				errs = append(errs, err.WithPath(path))
			}
		}
		sets, err := EffectivePodSets(c)
		if err != nil {
			errs = append(errs, field.Invalid(comps.Index(i).Child("podSets"), len(c.DeclaredPodSets), err.Error()))
			continue
		}
		podSets += len(sets)
	}
	if podSets == 0 {
		errs = append(errs, field.Invalid(comps, len(aw.Spec.Components), "the components contain no pod sets; at least 1 is required"))
	}
	if podSets > maxPodSets {
		errs = append(errs, field.Invalid(comps, podSets, fmt.Sprintf("the components contain %d pod sets; at most %d are allowed (Kueue)", podSets, maxPodSets)))
	}
	return errs
}

// fieldErr is a field error whose path is set by the caller.
type fieldErr struct {
	kind field.ErrorType // Forbidden, Invalid or InternalError
	msg  string
}

func (e *fieldErr) WithPath(p *field.Path) *field.Error {
	switch e.kind {
	case field.ErrorTypeForbidden:
		return field.Forbidden(p, e.msg)
	case field.ErrorTypeInvalid:
		return field.Invalid(p, "", e.msg)
	}
	return field.InternalError(p, fmt.Errorf("%s", e.msg))
}

// errNotServed is a kind the API server does not serve: the request is
// invalid, not the webhook broken.
var errNotServed = errors.New("is not served by the API server")

// authorize asks the API server whether the requesting user may create
// objects of kind gvk in namespace ns.
func (w *Webhook) authorize(ctx context.Context, req admission.Request, ns string, gvk schema.GroupVersionKind) *fieldErr {
	resource, err := w.resource(gvk)
	if errors.Is(err, errNotServed) {
		return &fieldErr{kind: field.ErrorTypeInvalid, msg: err.Error() + " (install its CRD first, or correct apiVersion and kind)"}
	}
	if err != nil {
		return &fieldErr{kind: field.ErrorTypeInternal, msg: err.Error()}
	}
	u := req.UserInfo
	sar := &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authv1.ResourceAttributes{
			Namespace: ns, Verb: "create", Group: gvk.Group, Version: gvk.Version, Resource: resource,
		},
		User: u.Username, UID: u.UID, Groups: u.Groups,
	}}
	if len(u.Extra) > 0 {
		sar.Spec.Extra = map[string]authv1.ExtraValue{}
		for k, v := range u.Extra {
			sar.Spec.Extra[k] = authv1.ExtraValue(v)
		}
	}
	res, err := w.sar.Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return &fieldErr{kind: field.ErrorTypeInternal, msg: fmt.Sprintf("SubjectAccessReview for %s: %v", resource, err)}
	}
	if !res.Status.Allowed {
		return &fieldErr{kind: field.ErrorTypeForbidden, msg: fmt.Sprintf("user %q may not create %s in namespace %q, so may not wrap them in an AppWrapper", u.Username, resource, ns)}
	}
	return nil
}

// resource is the plural resource of kind gvk, from discovery (cached).
// An unknown kind is an error: the object could not be created anyway.
func (w *Webhook) resource(gvk schema.GroupVersionKind) (string, error) {
	w.mu.Lock()
	r, ok := w.resources[gvk]
	w.mu.Unlock()
	if ok {
		return r, nil
	}
	list, err := w.disc.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("kind %s of apiVersion %s %w", gvk.Kind, gvk.GroupVersion(), errNotServed)
	}
	if err != nil {
		return "", fmt.Errorf("discover the resource of %v: %w", gvk, err)
	}
	for _, res := range list.APIResources {
		if res.Kind == gvk.Kind && !bytes.ContainsRune([]byte(res.Name), '/') {
			w.mu.Lock()
			w.resources[gvk] = res.Name
			w.mu.Unlock()
			return res.Name, nil
		}
	}
	return "", fmt.Errorf("kind %s of apiVersion %s %w", gvk.Kind, gvk.GroupVersion(), errNotServed)
}

// validateUpdate enforces the immutability of what validateCreate checked.
// The controller fixes the pod sets at the first pass; an edited template
// would otherwise take effect silently at the next reset.
func validateUpdate(old, aw *v1beta2.AppWrapper) field.ErrorList {
	const msg = "field is immutable"
	comps := field.NewPath("spec", "components")
	if len(old.Spec.Components) != len(aw.Spec.Components) {
		return field.ErrorList{field.Forbidden(comps, msg+": the number of components changed")}
	}
	var errs field.ErrorList
	for i := range aw.Spec.Components {
		o, n := old.Spec.Components[i], aw.Spec.Components[i]
		if !bytes.Equal(o.Template.Raw, n.Template.Raw) {
			errs = append(errs, field.Forbidden(comps.Index(i).Child("template"), msg))
		}
		if len(o.DeclaredPodSets) != len(n.DeclaredPodSets) {
			errs = append(errs, field.Forbidden(comps.Index(i).Child("podSets"), msg))
			continue
		}
		for j := range n.DeclaredPodSets {
			p := comps.Index(i).Child("podSets").Index(j)
			if replicas(o.DeclaredPodSets[j].Replicas) != replicas(n.DeclaredPodSets[j].Replicas) {
				errs = append(errs, field.Forbidden(p.Child("replicas"), msg))
			}
			if o.DeclaredPodSets[j].Path != n.DeclaredPodSets[j].Path {
				errs = append(errs, field.Forbidden(p.Child("path"), msg))
			}
		}
	}
	if (old.Spec.ManagedBy == nil) != (aw.Spec.ManagedBy == nil) ||
		(old.Spec.ManagedBy != nil && *old.Spec.ManagedBy != *aw.Spec.ManagedBy) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "managedBy"), msg))
	}
	return errs
}
