package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ftlauncher/ft-launcher/internal/cli"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
)

// cmdAppWrapperController runs the AppWrapper controller: the Kubernetes
// rung of the outer loop (workload resets), as `ft-resumer
// appwrapper-controller`. It replaces the upstream AppWrapper controller in
// a cluster; docs/kubernetes.md says how to deploy it.
func cmdAppWrapperController(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Its flags and messages keep the name users and the shipped
	// manifests give it.
	fs := cli.FlagSet("ft-resumer appwrapper-controller", stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else the pod's service account in a cluster, else ~/.kube/config)")
	cfgFile := fs.String("config", "", "operator configuration YAML: the upstream appwrapper-operator-config ConfigMap's content mounted as a file (fields not given keep their defaults; see docs/kubernetes.md)")
	metricsAddr := fs.String("metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint (0 disables it)")
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables them)")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader among replicas (a Lease in --leader-election-namespace)")
	leaderNS := fs.String("leader-election-namespace", "", "namespace of the leader-election Lease (default: the pod's namespace)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	webhookPort := fs.Int("webhook-port", 9443, "port of the admission webhook server (when the config's webhooksEnabled is true)")
	webhookCertDir := fs.String("webhook-cert-dir", filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs"), "directory of the webhook's tls.crt and tls.key (written there when --webhook-manage-certs)")
	webhookManage := fs.Bool("webhook-manage-certs", true, "generate the webhook's certificate, keep it in a Secret and set the webhook configurations' caBundle; false: the certificate is mounted in --webhook-cert-dir (cert-manager)")
	webhookNS := fs.String("webhook-namespace", "", "namespace of the webhook Service and certificate Secret (default: the pod's namespace)")
	webhookHosts := fs.StringSlice("webhook-cert-hosts", nil, "further DNS names or IP addresses for the self-managed certificate, for webhook configurations that reach the server by URL (comma-separated)")
	reevaluate := fs.Duration("reevaluate-period", appwrapper.DefaultConfig().ReevaluatePeriod.Duration,
		"periodic re-evaluation of a Running AppWrapper, a safety net for a missed watch event (0 disables; overrides the config's reevaluatePeriod)")
	if code, done := cli.Parse(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))

	cfg := appwrapper.DefaultConfig()
	if *cfgFile != "" {
		b, err := os.ReadFile(*cfgFile)
		if err != nil {
			fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: --config: %v\n", err)
			return 2
		}
		if cfg, err = appwrapper.LoadConfig(b); err != nil {
			fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: --config %s: %v\n", *cfgFile, err)
			return 2
		}
	}

	if fs.Changed("reevaluate-period") {
		if *reevaluate < 0 {
			fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: --reevaluate-period %v: must be >= 0 (0 disables)\n", *reevaluate)
			return 2
		}
		cfg.ReevaluatePeriod = appwrapper.Duration{Duration: *reevaluate}
	}

	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 2
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 1
	}
	if err := v1beta2.AddToScheme(scheme); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 1
	}
	var webhookServer webhook.Server
	var keepCA manager.Runnable
	if cfg.WebhooksEnabled {
		if webhookServer, keepCA, err = setupWebhookCerts(ctx, restCfg, scheme, log, *webhookNS, *webhookCertDir, *webhookHosts, *webhookManage, *webhookPort); err != nil {
			fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
			return 1
		}
	}
	var cacheOpts cache.Options
	appwrapper.ConfigureCache(&cacheOpts) // cache only the workloads' pods
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		WebhookServer:           webhookServer,
		Scheme:                  scheme,
		Cache:                   cacheOpts,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "appwrapper-controller.ft-launcher.dev",
		LeaderElectionNamespace: *leaderNS,
		// A clean stop (SIGTERM: a rollout, a drain) hands the Lease back
		// at once, so another replica leads within its retry period
		// instead of the lease duration. Safe: the manager stops every
		// leader-only runnable before it releases.
		LeaderElectionReleaseOnCancel: true,
		// The standby polls the Lease (and the leader renews it) every
		// RetryPeriod: 500 ms instead of 2 s puts a released Lease in the
		// standby's hands within about 1 s (jitter included) for two
		// small Lease writes a second instead of one every 2 s. The lease
		// duration stays 15 s: a leader that cannot reach the API server
		// for a few seconds keeps leading rather than flap.
		LeaseDuration: ptr(15 * time.Second),
		RenewDeadline: ptr(10 * time.Second),
		RetryPeriod:   ptr(500 * time.Millisecond),
	})
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: create the manager: %v\n", err)
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 1
	}
	ready := healthz.Ping
	if cfg.WebhooksEnabled {
		// Ready once the webhook serves: the webhook Service sends
		// admissions only to ready pods.
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 1
	}
	if err := appwrapper.SetupWithManager(mgr, cfg); err != nil {
		fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
		return 1
	}
	if cfg.WebhooksEnabled {
		if err := appwrapper.SetupWebhookWithManager(mgr, cfg); err != nil {
			fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
			return 1
		}
		if keepCA != nil {
			if err := mgr.Add(keepCA); err != nil {
				fmt.Fprintf(stderr, "ft-resumer appwrapper-controller: %v\n", err)
				return 1
			}
		}
	}
	log.Info("AppWrapper controller starting", "host", restCfg.Host, "leader_elect", *leaderElect, "webhooks", cfg.WebhooksEnabled)
	if err := mgr.Start(ctx); err != nil {
		log.Error("AppWrapper controller stopped", "err", err)
		return 1
	}
	log.Info("AppWrapper controller stopped")
	return 0
}

// restConfig is --kubeconfig's cluster, else controller-runtime's lookup
// ($KUBECONFIG, in-cluster, ~/.kube/config).
func restConfig(path string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
		}
		// As controller-runtime's lookup below: no client-side rate limit
		// (the API server's priority and fairness decides). A bare
		// kubeconfig leaves client-go's 5 QPS, burst 10, which paced every
		// admission past the burst to 200 ms (one SubjectAccessReview
		// each) and every reconcile's requests with it.
		if c.QPS == 0 {
			c.QPS = -1
		}
		return c, nil
	}
	c, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster to talk to (give --kubeconfig, set KUBECONFIG, or run in a pod): %w", err)
	}
	return c, nil
}

// setupWebhookCerts makes the webhook's certificate ready (self-managed,
// or mounted by cert-manager when manage is false) and returns the server
// that serves it and, self-managed, the runnable that keeps the webhook
// configurations' caBundle set (on every replica, leader or not).
func setupWebhookCerts(ctx context.Context, restCfg *rest.Config, scheme *runtime.Scheme, log *slog.Logger, ns, dir string, hosts []string, manage bool, port int) (webhook.Server, manager.Runnable, error) {
	server := webhook.NewServer(webhook.Options{Port: port, CertDir: dir})
	if !manage {
		return server, nil, nil
	}
	if ns == "" {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return nil, nil, fmt.Errorf("webhooksEnabled: give --webhook-namespace, or set webhooksEnabled: false in --config (not in a pod: %w)", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("webhook certificate: client: %w", err)
	}
	wc := appwrapper.ShippedWebhookCerts(ns, dir)
	wc.Hosts = hosts
	if err := wc.Ensure(ctx, c, time.Now()); err != nil {
		return nil, nil, err
	}
	keep := keepCABundle(func(ctx context.Context) error {
		wc.KeepCABundle(ctx, c, appwrapper.CABundleKeepInterval, func(msg string, err error) {
			if err != nil {
				log.Warn(msg, "err", err)
				return
			}
			log.Info(msg)
		})
		return nil
	})
	return server, keep, nil
}

// keepCABundle runs on every replica: each serves the webhook.
type keepCABundle func(context.Context) error

func (k keepCABundle) Start(ctx context.Context) error { return k(ctx) }
func (keepCABundle) NeedLeaderElection() bool          { return false }

func ptr[T any](v T) *T { return &v }
