package v1beta2

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// AppWrapperSpec is the desired state of an AppWrapper.
type AppWrapperSpec struct {
	// Components are the wrapped resources.
	Components []AppWrapperComponent `json:"components"`

	// Suspend: while true the wrapped resources are not deployed (Kueue
	// admits a workload by setting it false and preempts it by setting it
	// true).
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// ManagedBy names the controller of this AppWrapper; one that names
	// another controller is left alone.
	// +optional
	ManagedBy *string `json:"managedBy,omitempty"`
}

// AppWrapperComponent is one wrapped resource.
type AppWrapperComponent struct {
	// Annotations are carried on the component, not applied to it.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// DeclaredPodSets are the pods the component will create; inferred for
	// known kinds when empty.
	// +optional
	DeclaredPodSets []AppWrapperPodSet `json:"podSets,omitempty"`

	// PodSetInfos are merged into the pod templates at creation (Kueue's
	// admission: labels, annotations, node selector, tolerations, gates).
	// +optional
	PodSetInfos []AppWrapperPodSetInfo `json:"podSetInfos,omitempty"`

	// Template is the resource itself.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:EmbeddedResource
	Template runtime.RawExtension `json:"template"`
}

// AppWrapperPodSet is a set of identical pods a component creates.
type AppWrapperPodSet struct {
	// Replicas is the number of pods (nil means 1).
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Path is where the pod template is in the component, e.g.
	// "template.spec.template".
	Path string `json:"path"`

	// Annotations of the pod set (topology hints, ...).
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// AppWrapperPodSetInfo is what is merged into one pod set's template.
type AppWrapperPodSetInfo struct {
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	SchedulingGates []corev1.PodSchedulingGate `json:"schedulingGates,omitempty"`
}

// AppWrapperStatus is the observed state of an AppWrapper.
type AppWrapperStatus struct {
	// Phase of the AppWrapper.
	// +optional
	Phase AppWrapperPhase `json:"phase,omitempty"`

	// Retries counts the resets that spent a retry (an Autopilot migration
	// spends none). It is never reset. Its JSON name is resettingCount.
	// +optional
	Retries int32 `json:"resettingCount,omitempty"`

	// Conditions: QuotaReserved, ResourcesDeployed, PodsReady, Unhealthy,
	// DeletingResources.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ComponentStatus parallels spec.components.
	// +optional
	ComponentStatus []AppWrapperComponentStatus `json:"componentStatus,omitempty"`
}

// AppWrapperComponentStatus is the observed state of one component.
type AppWrapperComponentStatus struct {
	// Name of the created object (the real one when generateName is used).
	Name string `json:"name"`
	// Kind of the created object.
	Kind string `json:"kind"`
	// APIVersion of the created object.
	APIVersion string `json:"apiVersion"`
	// PodSets are the effective pod sets, fixed when the AppWrapper is first
	// seen so later spec edits do not change them.
	// +optional
	PodSets []AppWrapperPodSet `json:"podSets,omitempty"`
	// Conditions: ResourcesDeployed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AppWrapperPhase is the phase of an AppWrapper.
type AppWrapperPhase string

// Phases.
const (
	AppWrapperEmpty       AppWrapperPhase = ""
	AppWrapperSuspended   AppWrapperPhase = "Suspended"
	AppWrapperResuming    AppWrapperPhase = "Resuming"
	AppWrapperRunning     AppWrapperPhase = "Running"
	AppWrapperResetting   AppWrapperPhase = "Resetting"
	AppWrapperSuspending  AppWrapperPhase = "Suspending"
	AppWrapperSucceeded   AppWrapperPhase = "Succeeded"
	AppWrapperFailed      AppWrapperPhase = "Failed"
	AppWrapperTerminating AppWrapperPhase = "Terminating"
)

// AppWrapperCondition is a condition type.
type AppWrapperCondition string

// Condition types.
const (
	QuotaReserved     AppWrapperCondition = "QuotaReserved"
	ResourcesDeployed AppWrapperCondition = "ResourcesDeployed"
	PodsReady         AppWrapperCondition = "PodsReady"
	Unhealthy         AppWrapperCondition = "Unhealthy"
	DeletingResources AppWrapperCondition = "DeletingResources"
)

// Fault-tolerance annotations, on the AppWrapper's metadata.
const (
	AdmissionGracePeriodDurationAnnotation = "workload.codeflare.dev.appwrapper/admissionGracePeriodDuration"
	WarmupGracePeriodDurationAnnotation    = "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration"
	FailureGracePeriodDurationAnnotation   = "workload.codeflare.dev.appwrapper/failureGracePeriodDuration"
	RetryPausePeriodDurationAnnotation     = "workload.codeflare.dev.appwrapper/retryPausePeriodDuration"
	RetryLimitAnnotation                   = "workload.codeflare.dev.appwrapper/retryLimit"
	ForcefulDeletionGracePeriodAnnotation  = "workload.codeflare.dev.appwrapper/forcefulDeletionGracePeriodDuration"
	DeletionOnFailureGracePeriodAnnotation = "workload.codeflare.dev.appwrapper/deletionOnFailureGracePeriodDuration"
	SuccessTTLAnnotation                   = "workload.codeflare.dev.appwrapper/successTTLDuration"
	TerminalExitCodesAnnotation            = "workload.codeflare.dev.appwrapper/terminalExitCodes"
	RetryableExitCodesAnnotation           = "workload.codeflare.dev.appwrapper/retryableExitCodes"
)

// Labels and names the controller uses.
const (
	// AppWrapperLabel is put on every wrapped object and every pod of its
	// pod sets, with the AppWrapper's name: it is how pods are found.
	AppWrapperLabel = "workload.codeflare.dev/appwrapper"
	// Finalizer holds the AppWrapper until its resources are gone.
	Finalizer = "workload.codeflare.dev/finalizer"
	// UIDLabel (ours) is put on every wrapped object with the UID of the
	// AppWrapper that created it, and ComponentLabel with the index of its
	// component in spec.components: how the controller finds what it
	// already created, whatever the object's name (metadata.generateName
	// included) and whatever its status recorded.
	UIDLabel       = "appwrapper.ft-launcher.dev/uid"
	ComponentLabel = "appwrapper.ft-launcher.dev/component"
	// ControllerName is the value of spec.managedBy this controller owns.
	ControllerName = "workload.codeflare.dev/appwrapper-controller"
)

// AppWrapper wraps the resources of one workload so they are admitted,
// deployed, reset and deleted together.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName={aw}
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Quota Reserved",type="string",JSONPath=".status.conditions[?(@.type==\"QuotaReserved\")].status"
// +kubebuilder:printcolumn:name="Resources Deployed",type="string",JSONPath=".status.conditions[?(@.type==\"ResourcesDeployed\")].status"
// +kubebuilder:printcolumn:name="Unhealthy",type="string",JSONPath=".status.conditions[?(@.type==\"Unhealthy\")].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type AppWrapper struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AppWrapperSpec   `json:"spec,omitempty"`
	Status AppWrapperStatus `json:"status,omitempty"`
}

// AppWrapperList is a list of AppWrappers.
//
// +kubebuilder:object:root=true
type AppWrapperList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AppWrapper `json:"items"`
}
