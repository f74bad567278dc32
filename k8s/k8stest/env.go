// Package k8stest runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver through controller-runtime's envtest, with the AppWrapper
// CRD installed, and a real kube-controller-manager running the Job
// controller and the garbage collector. The binaries are built from the Go
// module proxy by scripts/k8s-assets.sh and found through KUBEBUILDER_ASSETS;
// nothing is downloaded at test time.
//
// What cannot run here is a kubelet (there is no container runtime): Kubelet
// stands in for it, binding pods to Node objects and writing pod status.
package k8stest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// ErrNoAssets is returned by Start when KUBEBUILDER_ASSETS does not name a
// folder with the etcd, kube-apiserver and kube-controller-manager binaries.
var ErrNoAssets = errors.New("k8stest: KUBEBUILDER_ASSETS does not hold etcd, kube-apiserver and kube-controller-manager: build them with `scripts/k8s-assets.sh` and export KUBEBUILDER_ASSETS=$(scripts/k8s-assets.sh)")

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as a cluster admin.
	Config *rest.Config
	// Client is an uncached client with the core, batch and AppWrapper types.
	Client client.Client
	// Clientset is client-go's typed client (bindings, status writes).
	Clientset *kubernetes.Clientset
	// Scheme knows the built-in types and AppWrapper.
	Scheme *k8sruntime.Scheme

	env *envtest.Environment
	kcm *exec.Cmd
	dir string
	// certDir holds the API server's certificates when StartWith made
	// them (Options.Address); Stop removes it.
	certDir string
}

// Assets returns the folder the binaries are in, or ErrNoAssets.
func Assets() (string, error) {
	if err := waitBuild(); err != nil {
		return "", err
	}
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", ErrNoAssets
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w (missing %s in %s)", ErrNoAssets, b, dir)
		}
	}
	return dir, nil
}

// Environment of a build of the binaries that scripts/test.sh runs in the
// background while the tests that need none of them run.
const (
	// EnvAssetsDone names the file that holds the build's exit status once
	// it has ended (absent until then).
	EnvAssetsDone = "FTL_K8S_ASSETS_DONE"
	// EnvAssetsLog names the build's log.
	EnvAssetsLog = "FTL_K8S_ASSETS_LOG"
)

// assetsWait bounds the wait for a background build: a cold one takes
// about 16 minutes on 2 idle cores, longer at nice 19 beside the tests.
const assetsWait = 50 * time.Minute

// waitBuild waits for the background build of the binaries, when one was
// started (EnvAssetsDone set), and reports its failure with its log's end.
func waitBuild() error {
	done := os.Getenv(EnvAssetsDone)
	if done == "" {
		return nil
	}
	start := time.Now()
	said := false
	for {
		b, err := os.ReadFile(done)
		if err == nil {
			if rc := strings.TrimSpace(string(b)); rc != "0" {
				logB, _ := os.ReadFile(os.Getenv(EnvAssetsLog))
				return fmt.Errorf("%w: scripts/k8s-assets.sh exited %s; the end of its log (%s):\n%s", ErrNoAssets, rc, os.Getenv(EnvAssetsLog), tail(string(logB), 3000))
			}
			if said {
				fmt.Fprintf(os.Stderr, "k8stest: the Kubernetes binaries are built (waited %v)\n", time.Since(start).Round(time.Second))
			}
			return nil
		}
		if time.Since(start) > assetsWait {
			return fmt.Errorf("%w: scripts/k8s-assets.sh, building in the background, did not end within %v (log: %s)", ErrNoAssets, assetsWait, os.Getenv(EnvAssetsLog))
		}
		if !said {
			fmt.Fprintf(os.Stderr, "k8stest: waiting for scripts/k8s-assets.sh to build the Kubernetes binaries (log: %s)\n", os.Getenv(EnvAssetsLog))
			said = true
		}
		time.Sleep(time.Second)
	}
}

// repoDir is the repository root, found from this file's location so tests
// in any package can reach deploy/.
func repoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// CRDDir is the folder of the CRDs the project ships.
func CRDDir() string { return filepath.Join(repoDir(), "deploy", "k8s", "crd") }

// Start starts etcd, kube-apiserver (with the shipped CRDs and the test
// PodGroup CRD) and kube-controller-manager.
func Start() (*Env, error) { return StartWith(Options{}) }

// Options shape the control plane for a test that needs more of a real
// cluster than the default one (which has no service accounts and serves
// on 127.0.0.1 only).
type Options struct {
	// Address, when set, is the host address the API server listens on
	// and advertises (the endpoint of the "kubernetes" Service, which pods
	// reach through kube-proxy); its serving certificate names it. It must
	// already be assigned to an interface.
	Address string
	// Cluster makes it a cluster as kubeadm's would be for pods that use
	// the API: the ServiceAccount admission plugin on (pods get their
	// service account's token), and the controllers that make service
	// accounts, publish the root CA (kube-root-ca.crt), run Deployments and
	// keep EndpointSlices, beside the Job controller and the garbage
	// collector.
	Cluster bool
	// NoCRDs leaves the shipped CRDs out: the test installs them as a user
	// would.
	NoCRDs bool
}

// StartWith is Start with opts.
func StartWith(opts Options) (*Env, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	sch := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		return nil, fmt.Errorf("k8stest: scheme: %w", err)
	}
	if err := v1beta2.AddToScheme(sch); err != nil {
		return nil, fmt.Errorf("k8stest: scheme: %w", err)
	}
	_, self, _, _ := runtime.Caller(0)
	crds := []string{CRDDir(), filepath.Join(filepath.Dir(self), "testdata", "crd")}
	if opts.NoCRDs {
		crds = crds[1:]
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
		Scheme:                sch,
	}
	var certDir string
	if opts.Address != "" || opts.Cluster {
		te.ControlPlane.APIServer = &envtest.APIServer{}
		if opts.Address != "" {
			// Both or neither: envtest picks a 127.0.0.1 port when either
			// is empty.
			port, err := freePort(opts.Address)
			if err != nil {
				return nil, err
			}
			te.ControlPlane.APIServer.SecureServing.ListenAddr = envtest.ListenAddr{Address: opts.Address, Port: strconv.Itoa(port)}
			// Certificates of our own (certs.go): envtest keeps the files
			// it finds in CertDir, and takes the CA from SecureServing.
			if certDir, err = os.MkdirTemp("", "k8stest-certs-"); err != nil {
				return nil, fmt.Errorf("k8stest: %w", err)
			}
			ca, err := writeClusterCerts(certDir, opts.Address)
			if err != nil {
				_ = os.RemoveAll(certDir)
				return nil, fmt.Errorf("k8stest: certificates: %w", err)
			}
			te.ControlPlane.APIServer.CertDir = certDir
			te.ControlPlane.APIServer.SecureServing.CA = ca
			te.ControlPlane.APIServer.Configure().Set("advertise-address", opts.Address)
		}
		if opts.Cluster {
			// envtest turns the plugin off because nothing makes the
			// namespaces' default service account; the controller manager
			// below does.
			te.ControlPlane.APIServer.Configure().Disable("disable-admission-plugins")
		}
	}
	cfg, err := te.Start()
	if err != nil {
		if certDir != "" {
			_ = os.RemoveAll(certDir)
		}
		return nil, fmt.Errorf("k8stest: start etcd and kube-apiserver from %s: %w", assets, err)
	}
	e := &Env{Config: cfg, Scheme: sch, env: te, certDir: certDir}
	fail := func(err error) (*Env, error) {
		_ = e.Stop()
		return nil, err
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: sch}); err != nil {
		return fail(fmt.Errorf("k8stest: client: %w", err))
	}
	if e.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return fail(fmt.Errorf("k8stest: clientset: %w", err))
	}
	if err := e.startControllerManager(assets, opts.Cluster); err != nil {
		return fail(err)
	}
	return e, nil
}

// startControllerManager runs the real Job controller (a Job's pods) and
// garbage collector (background deletion of a Job's pods) against the API
// server, as a cluster admin.
func (e *Env) startControllerManager(assets string, cluster bool) error {
	dir, err := os.MkdirTemp("", "k8stest-kcm-")
	if err != nil {
		return fmt.Errorf("k8stest: %w", err)
	}
	e.dir = dir
	kcPath, err := e.Kubeconfig(dir, "kube-controller-manager")
	if err != nil {
		return err
	}
	logPath := filepath.Join(dir, "kube-controller-manager.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("k8stest: %w", err)
	}
	defer logf.Close()
	args := []string{"--kubeconfig=" + kcPath, "--controllers=job,garbagecollector",
		"--leader-elect=false", "--secure-port=0", "--concurrent-job-syncs=10"}
	if cluster {
		ca := filepath.Join(dir, "ca.crt")
		if err := os.WriteFile(ca, e.Config.CAData, 0o644); err != nil {
			return fmt.Errorf("k8stest: %w", err)
		}
		args[1] = "--controllers=job,garbagecollector,deployment,replicaset,endpointslice,serviceaccount,root-ca-cert-publisher"
		args = append(args, "--root-ca-file="+ca)
	}
	cmd := exec.Command(filepath.Join(assets, "kube-controller-manager"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The controller manager dies with the test binary, even a killed one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("k8stest: start kube-controller-manager: %w", err)
	}
	e.kcm = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Ready once the Job controller has started and the garbage collector
	// has synced its monitors (the log lines of the pinned version).
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			e.kcm = nil
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("k8stest: kube-controller-manager exited (%v):\n%s", err, tail(string(b), 4000))
		case <-time.After(100 * time.Millisecond):
		}
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "Starting job controller") && strings.Contains(string(b), "Proceeding to collect garbage") {
			go func() { <-exited }()
			return nil
		}
	}
	b, _ := os.ReadFile(logPath)
	return fmt.Errorf("k8stest: kube-controller-manager did not start its Job controller within 60s:\n%s", tail(string(b), 4000))
}

// freePort returns a TCP port free on the host address addr.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("k8stest: a free port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Stop stops every process Start started and removes their files.
func (e *Env) Stop() error {
	var errs []error
	if e.kcm != nil && e.kcm.Process != nil {
		_ = syscall.Kill(-e.kcm.Process.Pid, syscall.SIGKILL)
		e.kcm = nil
	}
	if e.env != nil {
		if err := e.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("k8stest: stop envtest: %w", err))
		}
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	if e.certDir != "" {
		_ = os.RemoveAll(e.certDir)
	}
	return errors.Join(errs...)
}

// Main is TestMain for a package whose tests need the control plane: it
// starts it into *env, runs the tests, stops it and exits with the tests'
// status (Run, then os.Exit). Without the binaries it fails the run with the
// command that builds them, unless FTL_K8S_TESTS=skip is set: then the tests
// run with *env nil, and each one that needs the control plane ends in Need
// (a skip naming what is missing, or a failure under CI).
func Main(m *testing.M, env **Env) {
	os.Exit(Run(m, env))
}

// Run is Main without the exit, for a TestMain with cleanup of its own to
// do after the tests (deferred calls do not run past os.Exit).
func Run(m *testing.M, env **Env) int {
	// The fast lane (go test -short) starts no control plane: every test
	// that needs one ends in Need with a -short skip.
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	if _, err := Assets(); err != nil {
		if os.Getenv("FTL_K8S_TESTS") == "skip" {
			fmt.Fprintln(os.Stderr, "k8stest: no control plane (FTL_K8S_TESTS=skip):", err)
			return m.Run()
		}
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		fmt.Fprintln(os.Stderr, "(set FTL_K8S_TESTS=skip to skip these tests on a machine that cannot build them)")
		return 1
	}
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Need ends t when env is nil (no control plane: FTL_K8S_TESTS=skip
// without the binaries): a skip, or a failure under CI (internal/testenv).
// Every test that uses the control plane calls it first.
func Need(t testing.TB, env *Env) {
	t.Helper()
	if env != nil {
		return
	}
	testenv.SkipShort(t, "a real Kubernetes control plane")
	testenv.Missing(t, testenv.ControlPlane, fmt.Sprintf("FTL_K8S_TESTS=skip, and KUBEBUILDER_ASSETS=%q lacks etcd, kube-apiserver or kube-controller-manager", os.Getenv("KUBEBUILDER_ASSETS")))
}

// Namespace creates a fresh namespace for t.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + utilrand.String(5)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// Kubeconfig writes a cluster-admin kubeconfig for the API server into dir
// and returns its path, for commands under test (ft-resumer
// appwrapper-controller --kubeconfig).
func (e *Env) Kubeconfig(dir, user string) (string, error) {
	return e.KubeconfigAs(dir, user, "system:masters")
}

// KubeconfigAs is Kubeconfig for a user in the given groups only: RBAC
// decides what it may do (a service account is the user
// "system:serviceaccount:<namespace>:<name>").
func (e *Env) KubeconfigAs(dir, user string, groups ...string) (string, error) {
	u, err := e.env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("k8stest: user %s: %w", user, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("k8stest: kubeconfig: %w", err)
	}
	path := filepath.Join(dir, strings.ReplaceAll(user, ":", "_")+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	return path, nil
}
