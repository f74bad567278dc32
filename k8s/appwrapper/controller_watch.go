package appwrapper

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// podNodeField indexes the cached pods by the node they are bound to, for
// the node watch.
const podNodeField = "spec.nodeName"

// ConfigureCache restricts the manager's pod cache to pods that carry the
// AppWrapper label: the only pods the controller reads, and on a large
// cluster a small fraction of all of them. A command passes it its
// cache.Options before creating the manager.
func ConfigureCache(o *cache.Options) {
	sel, err := labels.NewRequirement(v1beta2.AppWrapperLabel, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("appwrapper: label requirement: %v", err)) // a constant label key: cannot fail
	}
	if o.ByObject == nil {
		o.ByObject = map[client.Object]cache.ByObject{}
	}
	o.ByObject[&corev1.Pod{}] = cache.ByObject{Label: labels.NewSelector().Add(*sel)}
	o.ByObject[&corev1.Node{}] = cache.ByObject{Transform: stripNode}
}

// SetupWithManager registers the reconciler and its watches on mgr:
//   - AppWrappers;
//   - every change of a pod carrying the AppWrapper label (creation,
//     readiness, failure, deletion) queues the AppWrapper it names, where
//     upstream watches only pod success and samples the rest every minute
//     (upstream's appwrapper_controller.go, Running phase);
//   - the objects it creates, metadata only, mapped to their controlling
//     AppWrapper: batch/v1 Job from the start, any other kind once a
//     component of that kind has been created;
//   - Nodes (the cache keeps them without their image lists): a change
//     of a node's readiness or of its unreachable or out-of-service
//     taints queues the AppWrappers with pods there (a deletion in
//     progress forces the pods of a dead node, deleteLostPods); with
//     Autopilot's monitorNodes, a change of its NoExecute resources
//     queues the AppWrappers with running pods there.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1beta2.AppWrapper{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool { return !statusOnlyComponents(e.ObjectOld, e.ObjectNew) },
		})).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToAppWrapper),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				if r.dropPodEvent != nil && r.dropPodEvent(o) {
					return false
				}
				return o.GetLabels()[v1beta2.AppWrapperLabel] != ""
			})))
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podNodeField, func(o client.Object) []string {
		if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("appwrapper: index pods by node: %w", err)
	}
	b = b.WatchesRawSource(source.Kind(mgr.GetCache(), &corev1.Node{},
		handler.TypedFuncs[*corev1.Node, reconcile.Request]{
			CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[*corev1.Node], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.nodeChanged(ctx, nil, e.Object, q)
			},
			UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[*corev1.Node], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.nodeChanged(ctx, e.ObjectOld, e.ObjectNew, q)
			},
			DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*corev1.Node], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.nodes.remove(e.Object.GetName())
				// Its pods are lost: a deletion in progress forces them.
				r.queuePodsOn(ctx, e.Object.GetName(), false, q)
			},
		}))
	c, err := b.Build(r)
	if err != nil {
		return fmt.Errorf("appwrapper: build controller: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctrl = c
	// Jobs are watched from the start without asking: the shipped RBAC
	// grants them.
	return r.watchKindLocked(batchv1.SchemeGroupVersion.WithKind("Job"))
}

// statusOnlyComponents reports an AppWrapper update that changed nothing
// but status.componentStatus: the controller's own record of a component
// creation or deletion in progress. The pass that wrote it carries on, or
// asked to run again when it needs to (a refused creation is retried
// after resuming's interval); queuing the AppWrapper for it would turn
// every refused creation into a hot loop of Create and two status writes.
func statusOnlyComponents(oldObj, newObj client.Object) bool {
	o, ok1 := oldObj.(*v1beta2.AppWrapper)
	n, ok2 := newObj.(*v1beta2.AppWrapper)
	if !ok1 || !ok2 {
		return false
	}
	if o.Generation != n.Generation || !o.DeletionTimestamp.Equal(n.DeletionTimestamp) ||
		!maps.Equal(o.Labels, n.Labels) || !maps.Equal(o.Annotations, n.Annotations) ||
		!slices.Equal(o.Finalizers, n.Finalizers) || equality.Semantic.DeepEqual(o.Status, n.Status) {
		return false
	}
	os, ns := o.Status.DeepCopy(), n.Status.DeepCopy()
	os.ComponentStatus, ns.ComponentStatus = nil, nil
	return equality.Semantic.DeepEqual(os, ns)
}

// podToAppWrapper maps a labelled pod to its AppWrapper.
func podToAppWrapper(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[v1beta2.AppWrapperLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// ensureWatch starts a metadata-only watch of kind gvk mapped to the
// controlling AppWrapper, once per kind. Watches are added as kinds are
// created, so a kind whose CRD is not installed is never watched; nor is a
// kind the controller may not list and watch (asked with a
// SelfSubjectAccessReview, again at most every refusedRecheck): its
// informer would retry the refused list for as long as the process runs.
// The periodic pass of a Running AppWrapper still reads such components.
func (r *Reconciler) ensureWatch(ctx context.Context, gvk schema.GroupVersionKind) {
	r.mu.Lock()
	if r.ctrl == nil || r.watched[gvk] || gvk.Kind == "" {
		r.mu.Unlock()
		return
	}
	if at, ok := r.refused[gvk]; ok && r.now().Sub(at) < refusedRecheck {
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	lg := log.FromContext(ctx).WithName(ControllerName)
	if ok, why := r.mayWatch(ctx, gvk); !ok {
		lg.Info("not watching a component kind", "gvk", gvk.String(), "why", why)
		r.mu.Lock()
		r.refused[gvk] = r.now()
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.refused, gvk)
	if err := r.watchKindLocked(gvk); err != nil {
		lg.Error(err, "watch component kind", "gvk", gvk.String())
	}
}

// watchKindLocked starts the watch of kind gvk unless it runs; r.mu is
// held.
func (r *Reconciler) watchKindLocked(gvk schema.GroupVersionKind) error {
	if r.watched[gvk] {
		return nil
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(gvk)
	src := source.Kind(r.cache, obj, handler.TypedEnqueueRequestForOwner[*metav1.PartialObjectMetadata](
		r.scheme, r.mapper, &v1beta2.AppWrapper{}, handler.OnlyControllerOwner()),
		predicate.NewTypedPredicateFuncs(func(o *metav1.PartialObjectMetadata) bool {
			return r.dropPodEvent == nil || !r.dropPodEvent(o)
		}))
	if err := r.ctrl.Watch(src); err != nil {
		return fmt.Errorf("appwrapper: watch %v: %w", gvk, err)
	}
	r.watched[gvk] = true
	return nil
}

// Watches reports whether the reconciler watches kind gvk.
func (r *Reconciler) Watches(gvk schema.GroupVersionKind) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watched[gvk]
}

// refusedRecheck is how often a kind the controller may not watch is asked
// about again (an administrator may grant it).
const refusedRecheck = time.Minute

// mayWatch reports whether the kind is served and the controller may list
// and watch it in every namespace (its cache is cluster-wide), and if not,
// why.
func (r *Reconciler) mayWatch(ctx context.Context, gvk schema.GroupVersionKind) (bool, string) {
	m, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, err.Error()
	}
	for _, verb := range []string{"list", "watch"} {
		ssar := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authv1.ResourceAttributes{Verb: verb, Group: gvk.Group, Version: gvk.Version, Resource: m.Resource.Resource},
		}}
		if err := r.client.Create(ctx, ssar); err != nil {
			return false, fmt.Sprintf("SelfSubjectAccessReview: %v", err)
		}
		if !ssar.Status.Allowed {
			return false, fmt.Sprintf("may not %s %s (add it to the controller's ClusterRole, deploy/k8s/rbac.yaml)", verb, m.Resource.Resource)
		}
	}
	return true, ""
}

// ensureComponentWatches watches the kinds of components created before
// this process started.
func (r *Reconciler) ensureComponentWatches(ctx context.Context, aw *v1beta2.AppWrapper) {
	for i := range aw.Status.ComponentStatus {
		cs := &aw.Status.ComponentStatus[i]
		if cs.Name != "" && cs.Kind != "" {
			r.ensureWatch(ctx, componentGVK(cs))
		}
	}
}

// nodeChanged queues the AppWrappers with pods on the node when its
// readiness or its unreachable or out-of-service taints changed (a
// deletion in progress may now force those pods), and, with Autopilot's
// monitorNodes, records the node's NoExecute resources and, when they
// changed and are not empty, queues every AppWrapper with a running pod on
// it (upstream's node_health_monitor.go; upstream does not queue them at all).
func (r *Reconciler) nodeChanged(ctx context.Context, old, n *corev1.Node, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if !n.GetDeletionTimestamp().IsZero() {
		r.nodes.remove(n.GetName())
		return
	}
	if old != nil && nodeState(old) != nodeState(n) {
		r.queuePodsOn(ctx, n.Name, false, q)
	}
	if !r.config.Autopilot.MonitorNodes {
		return
	}
	// Autopilot's "taints" are node labels.
	resources := NoExecuteResources(n, r.config.Autopilot)
	if !r.nodes.set(n.GetName(), resources) || len(resources) == 0 {
		return
	}
	r.queuePodsOn(ctx, n.Name, true, q)
}

// queuePodsOn queues the AppWrappers with pods on node (only Running ones
// with runningOnly).
func (r *Reconciler) queuePodsOn(ctx context.Context, node string, runningOnly bool, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.MatchingFields{podNodeField: node}); err != nil {
		log.FromContext(ctx).Error(err, "list pods on node", "node", node)
		return
	}
	seen := map[reconcile.Request]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if runningOnly && p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, req := range podToAppWrapper(ctx, p) {
			if !seen[req] {
				seen[req] = true
				q.Add(req)
			}
		}
	}
}
