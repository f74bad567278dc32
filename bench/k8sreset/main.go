// Command k8sreset measures how fast the AppWrapper controller reacts to a
// failed pod, against a real kube-apiserver and kube-controller-manager
// (package k8stest): pod marked Failed -> reset decided (the AppWrapper
// leaves Running), -> replacement pods created, -> replacement pods Running.
// The AppWrapper has zero failure-grace and retry-pause annotations, so what
// is measured is detection and the reset machinery, not the waits a user
// configures.
//
// Pods are run by k8stest's stand-in kubelet (no container runtime here):
// it polls every 25 ms, which is included in the "running" column only.
//
//	KUBEBUILDER_ASSETS=$(scripts/k8s-assets.sh) go run ./bench/k8sreset -n 20
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

const awYAML = `apiVersion: workload.codeflare.dev/v1beta2
kind: AppWrapper
metadata:
  name: bench
  annotations:
    workload.codeflare.dev.appwrapper/failureGracePeriodDuration: "0s"
    workload.codeflare.dev.appwrapper/retryPausePeriodDuration: "0s"
    workload.codeflare.dev.appwrapper/retryLimit: "100000"
spec:
  components:
  - template:
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: bench
      spec:
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: example.com/trainer:latest
              command: ["ft-launcher", "--nproc-per-node", "8", "train.py"]
`

func main() {
	n := flag.Int("n", 20, "resets to measure")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "k8sreset:", err)
		os.Exit(1)
	}
}

// tb is the testing.TB that k8stest's helpers want, for a program: Fatalf
// panics (run recovers it into an error) and Cleanup runs at the end. Only
// the methods those helpers call are implemented.
type tb struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func (t *tb) Helper()                      {}
func (t *tb) Name() string                 { return "k8sreset" }
func (t *tb) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (t *tb) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (t *tb) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (t *tb) Logf(f string, args ...any)   { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (t *tb) Cleanup(f func())             { t.mu.Lock(); t.cleanups = append(t.cleanups, f); t.mu.Unlock() }

// cleanup runs the registered cleanups, last first.
func (t *tb) cleanup() {
	t.mu.Lock()
	cs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

func run(n int) (err error) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(io.Discard, nil)))
	env, err := k8stest.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	t := &tb{}
	defer t.cleanup()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()

	var cacheOpts cache.Options
	appwrapper.ConfigureCache(&cacheOpts)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Cache: cacheOpts, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return err
	}
	if err := appwrapper.SetupWithManager(mgr, appwrapper.DefaultConfig()); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = mgr.Start(ctx) }()

	ns := env.Namespace(t)
	kl := env.NewKubelet(t, ns, "bench-a", "bench-b")
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(awYAML), &obj.Object); err != nil {
		return err
	}
	obj.SetNamespace(ns)
	if err := env.Client.Create(ctx, &obj); err != nil {
		return err
	}

	var decide, created, running []time.Duration
	seen := map[types.UID]bool{}
	pods, err := waitRunning(ctx, env, ns, seen)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		awW, err := wc.Watch(ctx, &v1beta2.AppWrapperList{}, client.InNamespace(ns))
		if err != nil {
			return err
		}
		podW, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := kl.Fail(ctx, pods[0].Name, 1, ""); err != nil {
			return err
		}
		d, c, err := observe(ctx, awW, podW, t0, seen)
		awW.Stop()
		podW.Stop()
		if err != nil {
			return err
		}
		if pods, err = waitRunning(ctx, env, ns, seen); err != nil {
			return err
		}
		r := time.Since(t0)
		decide, created, running = append(decide, d), append(created, c), append(running, r)
		fmt.Fprintf(os.Stderr, "reset %2d: decided %7.1f ms, pods created %7.1f ms, running %7.1f ms\n",
			i+1, ms(d), ms(c), ms(r))
	}
	fmt.Printf("%d resets (failure grace 0s, retry pause 0s), p50 / p90 / max in ms:\n", n)
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"pod Failed -> reset decided (AppWrapper leaves Running)", decide},
		{"pod Failed -> replacement pods created", created},
		{"pod Failed -> replacement pods Running (stand-in kubelet, 25 ms poll)", running}} {
		fmt.Printf("  %-72s %7.1f / %7.1f / %7.1f\n", row.name, pct(row.ds, 50), pct(row.ds, 90), pct(row.ds, 100))
	}
	return nil
}

// waitRunning waits for two Running pods not seen before, marks them seen
// and returns them.
func waitRunning(ctx context.Context, env *k8stest.Env, ns string, seen map[types.UID]bool) ([]corev1.Pod, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var list corev1.PodList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		var fresh []corev1.Pod
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && !seen[p.UID] {
				fresh = append(fresh, p)
			}
		}
		if len(fresh) == 2 {
			for _, p := range fresh {
				seen[p.UID] = true
			}
			return fresh, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("no two new running pods within 2 minutes")
}

// observe returns the time from t0 to the AppWrapper leaving Running and
// to the first replacement pod being created (both replacement pods).
func observe(ctx context.Context, awW, podW watch.Interface, t0 time.Time, seen map[types.UID]bool) (decided, created time.Duration, err error) {
	timeout := time.After(2 * time.Minute)
	newPods := map[types.UID]bool{}
	for decided == 0 || created == 0 {
		select {
		case ev, ok := <-awW.ResultChan():
			if !ok {
				return 0, 0, fmt.Errorf("AppWrapper watch closed")
			}
			if aw, isAW := ev.Object.(*v1beta2.AppWrapper); isAW && decided == 0 && aw.Status.Phase != v1beta2.AppWrapperRunning {
				decided = time.Since(t0)
			}
		case ev, ok := <-podW.ResultChan():
			if !ok {
				return 0, 0, fmt.Errorf("pod watch closed")
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added && !seen[p.UID] {
				newPods[p.UID] = true
				if len(newPods) == 2 && created == 0 {
					created = time.Since(t0)
				}
			}
		case <-timeout:
			return 0, 0, fmt.Errorf("no reset within 2 minutes (decided %v, created %v)", decided, created)
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	return decided, created, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return ms(s[i])
}
