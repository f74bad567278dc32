package appwrapper

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// deleteComponents makes progress deleting everything the AppWrapper created,
// with the guarantee of upstream's resource_management.go, deleteComponents: a
// background delete of each component first; ForcefulDeletionGracePeriod after
// DeletingResources turned True, every labelled pod is deleted with grace 0, and
// once none is left the remaining components too. gone is true only when no
// component and no labelled pod is left (confirmed by an uncached list, since
// the caller then releases the quota). left is the time until forcing starts
// when that is what is being waited for.
func (s *pass) deleteComponents(ctx context.Context) (gone bool, left time.Duration, err error) {
	aw := s.aw
	s.setCondition(v1beta2.DeletingResources, true, ReasonDeletionInitiated, "")
	deadline := s.since(v1beta2.DeletingResources).Add(s.p.ForcefulDeletionGracePeriod)
	now := s.r.now()
	forced := now.After(deadline)

	var remaining []int
	var firstErr error
	for i := range aw.Status.ComponentStatus {
		cs := &aw.Status.ComponentStatus[i]
		c := meta.FindStatusCondition(cs.Conditions, string(v1beta2.ResourcesDeployed))
		if c == nil || c.Status == metav1.ConditionFalse || (c.Status == metav1.ConditionUnknown && cs.Name == "") {
			continue
		}
		err := s.r.client.Delete(ctx, componentRef(aw.Namespace, cs), client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case apierrors.IsNotFound(err):
			s.setComponentCondition(cs, metav1.ConditionFalse, ReasonComponentDeleted, "")
			continue
		case err != nil:
			s.log.Error(err, "delete component", "kind", cs.Kind, "name", cs.Name)
			firstErr = cmpErr(firstErr, fmt.Errorf("delete %s %s: %w", cs.Kind, cs.Name, err))
		}
		remaining = append(remaining, i)
	}
	// Whatever else this AppWrapper owns, which its status does not name:
	// an object whose creation was never recorded goes too.
	extra, err := s.unlistedOwned(ctx)
	if err != nil {
		firstErr = cmpErr(firstErr, err)
	}
	for _, o := range extra {
		if !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		s.log.Info("deleting an owned object its status does not name", "kind", o.Kind, "name", o.Name)
		if err := s.r.client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			firstErr = cmpErr(firstErr, fmt.Errorf("delete %s %s: %w", o.Kind, o.Name, err))
		}
	}
	pods, err := s.listPods(ctx)
	if err != nil {
		return false, 0, err
	}
	left = deadline.Sub(now)
	if !forced {
		// Ours: pods no kubelet will finish are forced now, not after
		// the forceful-deletion grace.
		soon, err := s.deleteLostPods(ctx, pods, now)
		firstErr = cmpErr(firstErr, err)
		if soon > 0 && soon < left {
			left = soon
		}
	}
	if (len(remaining) > 0 || len(extra) > 0) && !forced {
		return false, left, firstErr
	}
	if len(remaining) == 0 && len(extra) == 0 && len(pods) == 0 {
		var live corev1.PodList
		if err := s.r.apiReader.List(ctx, &live, client.InNamespace(aw.Namespace),
			client.MatchingLabels{v1beta2.AppWrapperLabel: aw.Name}); err != nil {
			return false, 0, fmt.Errorf("list pods of AppWrapper %s/%s: %w", aw.Namespace, aw.Name, err)
		}
		if len(live.Items) == 0 {
			s.setCondition(v1beta2.DeletingResources, false, ReasonDeletionComplete, "")
			return true, 0, nil
		}
		// The cache lags: the pods' deletion events are still to come.
		return false, 0, nil
	}
	if !forced {
		return false, left, firstErr
	}

	// Forced: pods first, so nothing keeps running while components that
	// would recreate them are forced away.
	if len(pods) > 0 {
		for i := range pods {
			pod := &pods[i]
			if g := pod.DeletionGracePeriodSeconds; g != nil && *g == 0 {
				continue // already forced; a finalizer holds it
			}
			s.log.Info("forcing deletion of pod", "pod", pod.Name, "grace", "0s")
			if err := s.r.client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				firstErr = cmpErr(firstErr, fmt.Errorf("force delete pod %s: %w", pod.Name, err))
			}
		}
		return false, 0, firstErr
	}
	for _, i := range remaining {
		cs := &aw.Status.ComponentStatus[i]
		s.log.Info("forcing deletion of component", "kind", cs.Kind, "name", cs.Name, "grace", "0s")
		err := s.r.client.Delete(ctx, componentRef(aw.Namespace, cs),
			client.GracePeriodSeconds(0), client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !apierrors.IsNotFound(err) {
			firstErr = cmpErr(firstErr, fmt.Errorf("force delete %s %s: %w", cs.Kind, cs.Name, err))
		}
	}
	for _, o := range extra {
		s.log.Info("forcing deletion of an owned object", "kind", o.Kind, "name", o.Name, "grace", "0s")
		err := s.r.client.Delete(ctx, o, client.GracePeriodSeconds(0), client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !apierrors.IsNotFound(err) {
			firstErr = cmpErr(firstErr, fmt.Errorf("force delete %s %s: %w", o.Kind, o.Name, err))
		}
	}
	return false, 0, firstErr
}

// unlistedOwned lists, uncached, the objects of the components' kinds that
// this AppWrapper controls (found by its UID label or its name label,
// confirmed by the controller reference) and that status.componentStatus
// does not name as deployed: a creation whose status write was lost, or
// a duplicate left by an older controller. A kind that is not served has
// none.
func (s *pass) unlistedOwned(ctx context.Context) ([]*metav1.PartialObjectMetadata, error) {
	aw := s.aw
	named := map[schema.GroupVersionKind]map[string]bool{}
	kinds := map[schema.GroupVersionKind]bool{}
	for i := range aw.Status.ComponentStatus {
		cs := &aw.Status.ComponentStatus[i]
		gvk := componentGVK(cs)
		if gvk.Kind == "" {
			continue
		}
		kinds[gvk] = true
		c := meta.FindStatusCondition(cs.Conditions, string(v1beta2.ResourcesDeployed))
		if cs.Name != "" && c != nil && c.Status != metav1.ConditionFalse {
			if named[gvk] == nil {
				named[gvk] = map[string]bool{}
			}
			named[gvk][cs.Name] = true
		}
	}
	for _, comp := range aw.Spec.Components {
		if obj, err := DecodeTemplate(comp.Template); err == nil && obj.GetKind() != "" {
			kinds[obj.GroupVersionKind()] = true
		}
	}
	var out []*metav1.PartialObjectMetadata
	var firstErr error
	for gvk := range kinds {
		seen := map[string]bool{}
		for _, sel := range []client.MatchingLabels{{v1beta2.UIDLabel: string(aw.UID)}, {v1beta2.AppWrapperLabel: aw.Name}} {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := s.r.apiReader.List(ctx, list, client.InNamespace(aw.Namespace), sel); err != nil {
				if meta.IsNoMatchError(err) {
					break
				}
				firstErr = cmpErr(firstErr, fmt.Errorf("list the %s objects of AppWrapper %s/%s: %w", gvk.Kind, aw.Namespace, aw.Name, err))
				continue
			}
			for i := range list.Items {
				item := &list.Items[i]
				if seen[item.Name] || named[gvk][item.Name] {
					continue
				}
				if ref := metav1.GetControllerOf(item); ref == nil || ref.UID != aw.UID {
					continue
				}
				seen[item.Name] = true
				item.SetGroupVersionKind(gvk)
				out = append(out, item)
			}
		}
	}
	return out, firstErr
}

func cmpErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

// componentRef is a component as a metadata-only object, enough to delete
// it whatever its kind.
func componentRef(ns string, cs *v1beta2.AppWrapperComponentStatus) *metav1.PartialObjectMetadata {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(componentGVK(cs))
	obj.SetNamespace(ns)
	obj.SetName(cs.Name)
	return obj
}

// deleteLostPods deletes with grace 0, during a deletion and before
// ForcefulDeletionGracePeriod, the labelled pods that no kubelet will
// finish:
//   - on a node that is down (nodeDown: Ready False or Unknown, or the
//     unreachable taint, for Config.DeadNodeGracePeriod; the out-of-service
//     taint at once), or that no longer exists;
//   - with Autopilot's monitorNodes, terminating on a node flagged
//     NoExecute (EVICT) for a resource they request, once their own
//     termination grace has run out (their deletionTimestamp): the
//     kubelet there is alive and had its chance to stop them cleanly.
//
// A pod of a dead node is already stopped, or cut off from everything
// else: the cost of the force is that a node cut off by a network
// partition, not dead, may keep running its containers after the
// replacements start (as with any forced deletion); docs/kubernetes.md
// says how to choose the bound. soon is the time until the next such pod
// is due, 0 when none is waiting.
func (s *pass) deleteLostPods(ctx context.Context, pods []corev1.Pod, now time.Time) (soon time.Duration, err error) {
	bound := s.r.config.DeadNodeGracePeriod.Duration
	nodes := map[string]*corev1.Node{}
	var forced []string
	var firstErr error
	due := func(at time.Time) bool {
		if !now.Before(at) {
			return true
		}
		if d := at.Sub(now); soon == 0 || d < soon {
			soon = d
		}
		return false
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Spec.NodeName == "" {
			continue
		}
		if g := pod.DeletionGracePeriodSeconds; g != nil && *g == 0 {
			continue // already forced; a finalizer holds it
		}
		node, seen := nodes[pod.Spec.NodeName]
		if !seen {
			node, err = s.node(ctx, pod.Spec.NodeName)
			if err != nil {
				firstErr = cmpErr(firstErr, err)
				continue
			}
			nodes[pod.Spec.NodeName] = node
		}
		why := ""
		switch {
		case node == nil:
			why = "its node no longer exists"
		default:
			if since, down := nodeDown(node); down && due(since.Add(bound)) {
				why = fmt.Sprintf("node down (%s) since %s", nodeState(node), since.UTC().Format(time.RFC3339))
				if since.IsZero() {
					why = "node out of service (" + corev1.TaintNodeOutOfService + ")"
				}
				break
			}
			if s.r.config.Autopilot.MonitorNodes && pod.DeletionTimestamp != nil && flaggedNode(pod, map[string][]string{node.Name: NoExecuteResources(node, s.r.config.Autopilot)}) &&
				due(pod.DeletionTimestamp.Time) {
				why = "node flagged NoExecute by Autopilot and the pod's termination grace is over"
			}
		}
		if why == "" {
			continue
		}
		s.log.Info("forcing deletion of a pod no kubelet will finish", "pod", pod.Name, "node", pod.Spec.NodeName, "why", why, "grace", "0s")
		if err := s.r.client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			firstErr = cmpErr(firstErr, fmt.Errorf("force delete pod %s on node %s: %w", pod.Name, pod.Spec.NodeName, err))
			continue
		}
		forced = append(forced, fmt.Sprintf("%s on %s: %s", pod.Name, pod.Spec.NodeName, why))
	}
	if len(forced) > 0 {
		s.r.recorder.Eventf(s.aw, nil, corev1.EventTypeNormal, ReasonLostPodsForced, "Delete", "%s",
			truncate(fmt.Sprintf("%d pod(s) deleted with grace 0 before %s: %s", len(forced),
				v1beta2.ForcefulDeletionGracePeriodAnnotation, strings.Join(forced, "; "))))
	}
	return soon, firstErr
}

// node reads a node from the cache; nil when it does not exist, which an
// uncached read confirms (a node the cache has not seen yet is not gone).
func (s *pass) node(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := s.r.client.Get(ctx, client.ObjectKey{Name: name}, n)
	if apierrors.IsNotFound(err) {
		err = s.r.apiReader.Get(ctx, client.ObjectKey{Name: name}, n)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read node %s: %w", name, err)
	}
	return n, nil
}
