package appwrapper

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// initialComponentStatus is status.componentStatus as first written: the
// kind, version and name of each template with its effective pod sets.
func initialComponentStatus(aw *v1beta2.AppWrapper) ([]v1beta2.AppWrapperComponentStatus, error) {
	out := make([]v1beta2.AppWrapperComponentStatus, 0, len(aw.Spec.Components))
	for i, comp := range aw.Spec.Components {
		obj, err := DecodeTemplate(comp.Template)
		if err != nil {
			return nil, fmt.Errorf("component %d: %w", i, err)
		}
		podSets, err := EffectivePodSets(comp)
		if err != nil {
			return nil, fmt.Errorf("component %d (%s %s): %w", i, obj.GetKind(), obj.GetName(), err)
		}
		out = append(out, v1beta2.AppWrapperComponentStatus{
			Name:       obj.GetName(),
			Kind:       obj.GetKind(),
			APIVersion: obj.GetAPIVersion(),
			PodSets:    podSets,
		})
	}
	return out, nil
}

func componentGVK(cs *v1beta2.AppWrapperComponentStatus) schema.GroupVersionKind {
	return schema.FromAPIVersionAndKind(cs.APIVersion, cs.Kind)
}

func (s *pass) setComponentCondition(cs *v1beta2.AppWrapperComponentStatus, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&cs.Conditions, metav1.Condition{
		Type:               string(v1beta2.ResourcesDeployed),
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: s.aw.Generation,
	})
}

// createComponents creates every component not yet created (as upstream's
// resource_management.go). Before each Create it looks for an object this
// AppWrapper already created for the component (ownedComponent: by the
// UID and component labels, uncached), so a component is created once
// whatever its name, metadata.generateName included, and whatever a lost
// status write failed to record. fatal reports an error that no retry can
// fix.
func (s *pass) createComponents(ctx context.Context) (fatal bool, err error) {
	aw := s.aw
	if len(aw.Status.ComponentStatus) != len(aw.Spec.Components) {
		return true, fmt.Errorf("spec.components has %d entries but status.componentStatus %d: components were changed after submission",
			len(aw.Spec.Components), len(aw.Status.ComponentStatus))
	}
	opts := InjectOptions{
		SchedulerName: s.r.config.SchedulerName,
		Autopilot:     s.r.config.Autopilot,
		AvoidNodes:    avoidedHosts(aw, s.r.now()),
	}
	for i := range aw.Spec.Components {
		cs := &aw.Status.ComponentStatus[i]
		if meta.IsStatusConditionTrue(cs.Conditions, string(v1beta2.ResourcesDeployed)) {
			continue
		}
		obj, err := BuildComponent(aw, i, opts)
		if err != nil {
			// Decoding and injection depend only on the spec: every retry
			// would fail the same way.
			s.setComponentCondition(cs, metav1.ConditionFalse, ReasonComponentCreationErrored, err.Error())
			return true, fmt.Errorf("component %d: %w", i, err)
		}
		labelComponent(obj, aw, i)
		if err := controllerutil.SetControllerReference(aw, obj, s.r.scheme); err != nil {
			s.setComponentCondition(cs, metav1.ConditionFalse, ReasonComponentCreationErrored, err.Error())
			return true, fmt.Errorf("component %d: owner reference: %w", i, err)
		}
		gvk := obj.GroupVersionKind()
		cs.Name, cs.Kind, cs.APIVersion = obj.GetName(), gvk.Kind, gvk.GroupVersion().String()
		s.setComponentCondition(cs, metav1.ConditionUnknown, ReasonComponentCreationInitiated, "")
		if err := s.save(ctx); err != nil {
			return false, err
		}
		cs = &aw.Status.ComponentStatus[i] // the write decoded a new status into aw

		existing, err := s.ownedComponent(ctx, gvk, i)
		switch {
		case err != nil:
			s.setComponentCondition(cs, metav1.ConditionFalse, ReasonComponentCreationErrored, err.Error())
			return false, fmt.Errorf("component %d: %w", i, err)
		case existing != nil:
			// Created by an earlier pass whose status write was lost.
			s.log.Info("component already created; adopting it", "kind", gvk.Kind, "name", existing.GetName(), "component", i)
			obj = existing
		default:
			obj, fatal, err = s.create(ctx, obj)
			if err != nil {
				// A failed creation is marked False, not left Unknown: it
				// must never be waited for at deletion (upstream's
				// resource_management.go guards the same missing-CRD
				// wedge).
				s.setComponentCondition(cs, metav1.ConditionFalse, ReasonComponentCreationErrored, err.Error())
				return fatal, fmt.Errorf("component %d: %w", i, err)
			}
		}
		cs.Name = obj.GetName()
		s.setComponentCondition(cs, metav1.ConditionTrue, ReasonComponentCreatedSuccessfully, "")
		if err := s.save(ctx); err != nil {
			return false, err
		}
		s.r.ensureWatch(ctx, gvk)
	}
	return false, nil
}

// create creates obj and returns it as created (the name generated from
// metadata.generateName included). An AlreadyExists is accepted when the
// object in the way is ours and not being deleted.
func (s *pass) create(ctx context.Context, obj *unstructured.Unstructured) (_ *unstructured.Unstructured, fatal bool, err error) {
	gvk := obj.GroupVersionKind()
	err = s.r.client.Create(ctx, obj)
	if s.r.afterCreate != nil {
		s.r.afterCreate(obj, err)
	}
	switch {
	case err == nil:
		return obj, false, nil
	case apierrors.IsAlreadyExists(err):
		existing, gerr := s.ownedExisting(ctx, obj)
		if gerr != nil {
			return nil, errors.Is(gerr, errNotOurs), gerr
		}
		return existing, false, nil
	case apierrors.IsInvalid(err), meta.IsNoMatchError(err):
		return nil, true, fmt.Errorf("create %s %s: %w", gvk.Kind, objName(obj), err)
	default:
		// Forbidden (RBAC, a full ResourceQuota, Pod Security) and
		// transient errors: retried at the pace of resuming, never
		// faster.
		return nil, false, fmt.Errorf("create %s %s: %w", gvk.Kind, objName(obj), err)
	}
}

// objName is the name of an object to create, or its generateName prefix.
func objName(obj *unstructured.Unstructured) string {
	if n := obj.GetName(); n != "" {
		return n
	}
	return obj.GetGenerateName() + "*"
}

// labelComponent puts the UID and component labels on a component.
func labelComponent(obj *unstructured.Unstructured, aw *v1beta2.AppWrapper, idx int) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1beta2.UIDLabel] = string(aw.UID)
	labels[v1beta2.ComponentLabel] = strconv.Itoa(idx)
	obj.SetLabels(labels)
}

// ownedComponent is the object of kind gvk this AppWrapper already created
// for component idx, or nil. It lists uncached: the cache may not have
// seen a Create of a moment ago, which is the case it is there for. One
// being deleted (from before a reset) is an error to retry until it is
// gone.
func (s *pass) ownedComponent(ctx context.Context, gvk schema.GroupVersionKind, idx int) (*unstructured.Unstructured, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := s.r.apiReader.List(ctx, list, client.InNamespace(s.aw.Namespace), client.MatchingLabels{
		v1beta2.UIDLabel: string(s.aw.UID), v1beta2.ComponentLabel: strconv.Itoa(idx),
	}); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil // Create reports the missing kind, fatally
		}
		return nil, fmt.Errorf("list the %s objects this AppWrapper created (needed so that none is created twice): %w", gvk.Kind, err)
	}
	var found *unstructured.Unstructured
	for i := range list.Items {
		item := &list.Items[i]
		if ref := metav1.GetControllerOf(item); ref == nil || ref.UID != s.aw.UID {
			continue
		}
		if !item.GetDeletionTimestamp().IsZero() {
			return nil, fmt.Errorf("%s %s is still being deleted", gvk.Kind, item.GetName())
		}
		if found == nil || item.GetCreationTimestamp().Time.Before(found.GetCreationTimestamp().Time) {
			found = &unstructured.Unstructured{}
			found.SetGroupVersionKind(gvk)
			found.SetNamespace(item.GetNamespace())
			found.SetName(item.GetName())
			found.SetCreationTimestamp(item.GetCreationTimestamp())
		}
	}
	return found, nil
}

// errNotOurs is an existing object in the way that this AppWrapper does not
// control: fatal.
var errNotOurs = errors.New("exists and is not controlled by this AppWrapper")

// ownedExisting reads the object a Create found in the way, uncached, and
// returns it when this AppWrapper controls it.
func (s *pass) ownedExisting(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(obj.GroupVersionKind())
	if err := s.r.apiReader.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return nil, fmt.Errorf("read existing %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	if ref := metav1.GetControllerOf(existing); ref == nil || ref.UID != s.aw.UID {
		return nil, fmt.Errorf("%s %s %w", obj.GetKind(), obj.GetName(), errNotOurs)
	}
	if !existing.GetDeletionTimestamp().IsZero() {
		// Ours, but from before a reset and still going away: not the
		// component to run; retry until it is gone.
		return nil, fmt.Errorf("%s %s is still being deleted", obj.GetKind(), obj.GetName())
	}
	return existing, nil
}

// componentHealthSummary counts the components as assess's rungs 3
// and 4 need them.
type componentHealthSummary struct {
	expected, deployed, failed int
	// failing counts Jobs the Job controller has declared failed
	// (FailureTarget) but not yet marked Failed, which it does only once
	// their other pods have terminated. Rung 4 counts them once a failed
	// pod is seen, so that rung 3 has read that pod's verdict first.
	failing              int
	missing, failedNames []string
}

// componentHealth reads every component. One that looks gone (not found, or
// being deleted) is read again from the API server before it counts as missing,
// since a cache that has not caught up with a fresh Create would otherwise fail
// a healthy workload (upstream issue #416; docs/kubernetes.md, "What it does
// better than the upstream controller").
func (s *pass) componentHealth(ctx context.Context) (componentHealthSummary, error) {
	h := componentHealthSummary{expected: len(s.aw.Spec.Components)}
	for i := range s.aw.Status.ComponentStatus {
		cs := &s.aw.Status.ComponentStatus[i]
		obj, alive, err := s.readComponent(ctx, s.r.client, cs)
		if err != nil {
			return h, err
		}
		if !alive {
			if obj, alive, err = s.readComponent(ctx, s.r.apiReader, cs); err != nil {
				return h, err
			}
		}
		if !alive {
			h.missing = append(h.missing, fmt.Sprintf("%s %s", cs.Kind, cs.Name))
			continue
		}
		h.deployed++
		switch componentFate(obj) {
		case fateFailed:
			h.failed++
		case fateFailing:
			h.failing++
		default:
			continue
		}
		h.failedNames = append(h.failedNames, fmt.Sprintf("%s %s", cs.Kind, cs.Name))
	}
	return h, nil
}

// readComponent reads a component; alive is false when it is not found or
// is being deleted.
func (s *pass) readComponent(ctx context.Context, r client.Reader, cs *v1beta2.AppWrapperComponentStatus) (*unstructured.Unstructured, bool, error) {
	if cs.Name == "" {
		return nil, false, nil
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(componentGVK(cs))
	err := r.Get(ctx, client.ObjectKey{Namespace: s.aw.Namespace, Name: cs.Name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read component %s %s: %w", cs.Kind, cs.Name, err)
	}
	return obj, obj.GetDeletionTimestamp().IsZero(), nil
}

// fate is what a component's own status says of its end.
type fate int

const (
	fateNone fate = iota
	// fateFailing: a Job with FailureTarget=True and no Failed yet. The
	// Job controller sets FailureTarget the moment it decides the Job
	// fails (backoffLimit reached, a pod failure policy's FailJob, a
	// deadline) and adds Failed only once every other pod of the Job has
	// terminated, which for pods still training takes their graceful stop:
	// about 5 s of the 7 s from a pod's failure to the reset in
	// TestShippedInstall before this was read.
	fateFailing
	// fateFailed: Failed=True.
	fateFailed
)

// componentFate recognises the two kinds whose own status says failed for
// good: batch/v1 Job and kubeflow.org PyTorchJob, both through a
// Failed=True condition, and a Job's FailureTarget=True (assess.go, rung
// 4). Ray kinds are left out on purpose: their failed state is not
// terminal.
func componentFate(obj *unstructured.Unstructured) fate {
	gvk := obj.GroupVersionKind()
	job := gvk.Group == "batch" && gvk.Kind == "Job"
	if !job && (gvk.Group != "kubeflow.org" || gvk.Kind != "PyTorchJob") {
		return fateNone
	}
	f := fateNone
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["status"] != "True" {
			continue
		}
		switch {
		case m["type"] == "Failed":
			return fateFailed
		case m["type"] == "FailureTarget" && job:
			f = fateFailing
		}
	}
	return f
}

// listPods lists the AppWrapper's pods by the injected label.
func (s *pass) listPods(ctx context.Context) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := s.r.client.List(ctx, &pods, client.InNamespace(s.aw.Namespace),
		client.MatchingLabels{v1beta2.AppWrapperLabel: s.aw.Name}); err != nil {
		return nil, fmt.Errorf("list pods of AppWrapper %s/%s: %w", s.aw.Namespace, s.aw.Name, err)
	}
	return pods.Items, nil
}
