package v1beta2

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is the AppWrapper API's group and version.
var GroupVersion = schema.GroupVersion{Group: "workload.codeflare.dev", Version: "v1beta2"}

// SchemeBuilder registers the AppWrapper types; AddToScheme adds them to a
// scheme.
var (
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	AddToScheme   = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&AppWrapper{}, &AppWrapperList{})
}
