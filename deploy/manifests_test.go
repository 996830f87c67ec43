package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The image every prefixd container runs, built by docker/Dockerfile.
const prefixdImage = "ghcr.io/prefixd/prefixd"

// thirdPartyImages are the images the manifests use deliberately besides
// prefixd's own, and whether their containers are exempt from the
// non-root, read-only sandbox (vLLM's image runs as root and writes its
// caches).
var thirdPartyImages = map[string]bool{
	"quay.io/coreos/etcd:v3.7.3": false,
	"vllm/vllm-openai:v0.26.0":   true,
	"curlimages/curl:8.11.1":     false,
}

// kustomizations are every directory under kubernetes/ holding a
// kustomization.yaml, and the Secrets each expects the operator to create.
var kustomizations = map[string][]string{
	"kubernetes/base":                   {"prefixd-api-token"},
	"kubernetes/overlays/external-etcd": {"prefixd-api-token", "prefixd-etcd-client-tls"},
	"kubernetes/overlays/smoke":         nil,
	"kubernetes/examples/vllm":          {"hf-token"},
	"kubernetes/examples/proxy":         {"prefixd-api-token"},
	"kubernetes/examples/gateway":       {"hf-token", "prefixd-api-token"},
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// prefixdBinary builds ./cmd/prefixd once per test process (with -race
// when the tests run with it, so the build reuses their compiled packages).
func prefixdBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "prefixd-deploy")
		if binErr != nil {
			return
		}
		args := []string{"build", "-o", filepath.Join(binDir, "prefixd")}
		if raceBuild {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/prefixd")...)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/prefixd: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "prefixd")
}

var (
	flagsMu    sync.Mutex
	flagsCache = map[string]map[string]bool{}
	helpFlag   = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)
)

// flagsOf returns the flags of `prefixd <sub>`, read from its --help.
func flagsOf(t *testing.T, sub string) map[string]bool {
	t.Helper()
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if fs, ok := flagsCache[sub]; ok {
		return fs
	}
	out, err := exec.Command(prefixdBinary(t), sub, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "prefixd "+sub+" [flags]") {
		t.Fatalf("prefixd %s --help: %v\n%s", sub, err, out)
	}
	fs := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		fs[m[1]] = true
	}
	if len(fs) < 2 {
		t.Fatalf("prefixd %s --help lists no flags:\n%s", sub, out)
	}
	flagsCache[sub] = fs
	return fs
}

// checkInvocation requires args to be `<sub> --flag=value|--flag ...` with
// flags of that subcommand, and every PREFIXD_* variable in env to name one.
func checkInvocation(t *testing.T, where string, args, env []string) (sub string, values map[string]string) {
	t.Helper()
	if len(args) == 0 {
		t.Errorf("%s: no prefixd subcommand", where)
		return "", nil
	}
	sub = args[0]
	fs := flagsOf(t, sub)
	values = map[string]string{}
	for _, a := range args[1:] {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !fs[name] {
			t.Errorf("%s: prefixd %s has no flag %q", where, sub, a)
			continue
		}
		values[name] = value
	}
	for _, e := range env {
		if !strings.HasPrefix(e, "PREFIXD_") {
			continue
		}
		name := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(e, "PREFIXD_")), "_", "-")
		if !fs[name] {
			t.Errorf("%s: %s names no flag of prefixd %s", where, e, sub)
		}
		values[name] = "$" + e
	}
	return sub, values
}

type object map[string]any

func (o object) kind() string { return o.str("kind") }
func (o object) name() string { return o.str("metadata", "name") }

func (o object) str(path ...string) string {
	s, _ := o.get(path...).(string)
	return s
}

func (o object) get(path ...string) any {
	var v any = map[string]any(o)
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// decode converts part of an object into a typed value.
func (o object) decode(t *testing.T, into any, path ...string) {
	t.Helper()
	raw, err := json.Marshal(o.get(path...))
	if err == nil {
		err = json.Unmarshal(raw, into)
	}
	if err != nil {
		t.Fatalf("%s %s: decode %v: %v", o.kind(), o.name(), path, err)
	}
}

type podSpec struct {
	SecurityContext *securityContext `json:"securityContext"`
	Containers      []container      `json:"containers"`
	InitContainers  []container      `json:"initContainers"`
	Volumes         []struct {
		Name   string `json:"name"`
		Secret *struct {
			SecretName string `json:"secretName"`
		} `json:"secret"`
	} `json:"volumes"`
}

type securityContext struct {
	RunAsNonRoot             *bool `json:"runAsNonRoot"`
	RunAsUser                *int  `json:"runAsUser"`
	ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
	Capabilities             *struct {
		Drop []string `json:"drop"`
	} `json:"capabilities"`
}

type envVar struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		} `json:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `json:"fieldPath"`
		} `json:"fieldRef"`
	} `json:"valueFrom"`
}

type container struct {
	Name            string           `json:"name"`
	Image           string           `json:"image"`
	Command         []string         `json:"command"`
	Args            []string         `json:"args"`
	Env             []envVar         `json:"env"`
	Ports           []containerPort  `json:"ports"`
	StartupProbe    *probe           `json:"startupProbe"`
	LivenessProbe   *probe           `json:"livenessProbe"`
	ReadinessProbe  *probe           `json:"readinessProbe"`
	SecurityContext *securityContext `json:"securityContext"`
	VolumeMounts    []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type containerPort struct {
	Name          string `json:"name"`
	ContainerPort int    `json:"containerPort"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
	TCPSocket *struct {
		Port any `json:"port"`
	} `json:"tcpSocket"`
	GRPC *struct {
		Port    int     `json:"port"`
		Service *string `json:"service"`
	} `json:"grpc"`
}

func (c container) envNames() []string {
	var out []string
	for _, e := range c.Env {
		out = append(out, e.Name)
	}
	return out
}

func (c container) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// hasPort reports whether the container exposes p (a port name or number).
func (c container) hasPort(p any) bool {
	for _, cp := range c.Ports {
		switch v := p.(type) {
		case string:
			if cp.Name == v {
				return true
			}
		case float64:
			if cp.ContainerPort == int(v) {
				return true
			}
		}
	}
	return false
}

// workload is a pod template: a Deployment's, StatefulSet's, Job's or Pod's.
type workload struct {
	kind, name string
	replicas   int
	labels     map[string]string
	pod        podSpec
}

func (w workload) containers() []container {
	return append(slices.Clone(w.pod.Containers), w.pod.InitContainers...)
}

// rendering is one kustomization's output.
type rendering struct {
	dir       string
	objects   []object
	workloads []workload
}

func (r rendering) find(kind, name string) object {
	for _, o := range r.objects {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	return nil
}

func (r rendering) workload(kind, name string) (workload, bool) {
	for _, w := range r.workloads {
		if w.kind == kind && w.name == name {
			return w, true
		}
	}
	return workload{}, false
}

// selected returns the workloads whose pods sel (matchLabels) selects.
func (r rendering) selected(sel map[string]string) []workload {
	var out []workload
	for _, w := range r.workloads {
		if len(sel) > 0 && matches(sel, w.labels) {
			out = append(out, w)
		}
	}
	return out
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// render runs `kustomize build dir` in-process.
func render(t *testing.T, dir string) rendering {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objects []object
	for _, res := range m.Resources() {
		mp, err := res.Map()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, res.CurId(), err)
		}
		objects = append(objects, object(mp))
	}
	return newRendering(t, dir, objects)
}

// newRendering decodes the pod templates of objects.
func newRendering(t *testing.T, dir string, objects []object) rendering {
	t.Helper()
	r := rendering{dir: dir, objects: objects}
	for _, o := range objects {
		w := workload{kind: o.kind(), name: o.name(), replicas: 1}
		switch o.kind() {
		case "Deployment", "StatefulSet", "Job":
			o.decode(t, &w.labels, "spec", "template", "metadata", "labels")
			o.decode(t, &w.pod, "spec", "template", "spec")
			if n, ok := o.get("spec", "replicas").(float64); ok {
				w.replicas = int(n)
			} else if n, ok := o.get("spec", "replicas").(int); ok {
				w.replicas = n
			}
		case "Pod":
			o.decode(t, &w.labels, "metadata", "labels")
			o.decode(t, &w.pod, "spec")
		default:
			continue
		}
		r.workloads = append(r.workloads, w)
	}
	return r
}

// TestKustomizationsBuild: every directory with a kustomization.yaml is
// one of the known ones and builds, and every YAML file under kubernetes/
// parses and is used by a kustomization.
func TestKustomizationsBuild(t *testing.T) {
	used := map[string]bool{}
	var dirs, files []string
	err := filepath.WalkDir("kubernetes", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		files = append(files, path)
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range strings.Split(string(raw), "\n---\n") {
			var v any
			if err := yaml.UnmarshalStrict([]byte(doc), &v); err != nil {
				t.Errorf("%s: document %d: %v", path, i, err)
			}
		}
		if filepath.Base(path) != "kustomization.yaml" {
			return nil
		}
		dir := filepath.Dir(path)
		dirs = append(dirs, dir)
		used[path] = true
		var k struct {
			Resources []string `json:"resources"`
			Patches   []struct {
				Path string `json:"path"`
			} `json:"patches"`
		}
		if err := yaml.Unmarshal(raw, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, r := range k.Resources {
			used[filepath.Join(dir, r)] = true
		}
		for _, p := range k.Patches {
			if p.Path != "" {
				used[filepath.Join(dir, p.Path)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for d := range kustomizations {
		want = append(want, d)
	}
	sort.Strings(want)
	sort.Strings(dirs)
	if !slices.Equal(dirs, want) {
		t.Errorf("kustomizations %v, want %v (add a new one to the kustomizations table)", dirs, want)
	}
	for _, f := range files {
		if !used[f] {
			t.Errorf("%s is used by no kustomization", f)
		}
	}
	for _, d := range dirs {
		if r := render(t, d); len(r.objects) == 0 {
			t.Errorf("%s renders nothing", d)
		}
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// TestContainers: images, flags, variable references, sandbox, probes and
// Secrets of every container in every kustomization.
func TestContainers(t *testing.T) {
	tags := map[string]string{} // prefixd image tag -> where
	for dir, operatorSecrets := range kustomizations {
		r := render(t, dir)
		secrets := map[string]bool{}
		for _, s := range operatorSecrets {
			secrets[s] = true
		}
		for _, o := range r.objects {
			if o.kind() == "Secret" {
				secrets[o.name()] = true
			}
		}
		for _, w := range r.workloads {
			if len(w.pod.Containers) == 0 {
				t.Errorf("%s: %s %s has no containers", dir, w.kind, w.name)
			}
			for _, v := range w.pod.Volumes {
				if v.Secret != nil && !secrets[v.Secret.SecretName] {
					t.Errorf("%s: %s %s mounts Secret %s, which nothing creates", dir, w.kind, w.name, v.Secret.SecretName)
				}
			}
			for _, c := range w.containers() {
				where := fmt.Sprintf("%s: %s %s container %s", dir, w.kind, w.name, c.Name)
				checkContainer(t, where, w, c, secrets, tags)
			}
		}
	}
	if len(tags) != 1 {
		t.Errorf("prefixd image tags %v: want one tag everywhere", tags)
	}
}

func checkContainer(t *testing.T, where string, w workload, c container, secrets map[string]bool, tags map[string]string) {
	t.Helper()
	exempt := false
	switch repo, tag, _ := strings.Cut(c.Image, ":"); {
	case repo == prefixdImage && tag != "":
		tags[tag] = where
		if len(c.Command) > 0 {
			t.Errorf("%s: overrides the image's entrypoint (prefixd) with %q", where, c.Command)
		}
		checkInvocation(t, where, c.Args, c.envNames())
	default:
		e, ok := thirdPartyImages[c.Image]
		if !ok {
			t.Errorf("%s: image %q is neither %s:<tag> nor a known third-party image", where, c.Image, prefixdImage)
		}
		exempt = e
	}
	// $(VAR) is expanded by Kubernetes only for variables defined earlier
	// in env; anything else stays literal.
	defined := map[string]bool{}
	for _, e := range c.Env {
		for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				t.Errorf("%s: env %s refers to $(%s), not defined before it", where, e.Name, m[1])
			}
		}
		defined[e.Name] = true
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !secrets[e.ValueFrom.SecretKeyRef.Name] {
			t.Errorf("%s: env %s reads Secret %s, which nothing creates", where, e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				t.Errorf("%s: argument %q refers to $(%s), which env does not define", where, a, m[1])
			}
		}
	}
	for name, p := range map[string]*probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		switch {
		case p == nil:
		case p.HTTPGet != nil && !c.hasPort(p.HTTPGet.Port), p.TCPSocket != nil && !c.hasPort(p.TCPSocket.Port),
			p.GRPC != nil && !c.hasPort(float64(p.GRPC.Port)):
			t.Errorf("%s: %s probe's port is not a port of the container", where, name)
		case p.HTTPGet == nil && p.TCPSocket == nil && p.GRPC == nil:
			t.Errorf("%s: %s probe is neither httpGet, tcpSocket nor grpc", where, name)
		}
	}
	if exempt {
		return
	}
	sc, psc := c.SecurityContext, w.pod.SecurityContext
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	if !nonRoot {
		t.Errorf("%s: runAsNonRoot is not set", where)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("%s: want readOnlyRootFilesystem, no privilege escalation and all capabilities dropped", where)
	}
}

// TestSelectors: Services, ServiceMonitors, PodDisruptionBudgets and
// NetworkPolicies select pods (or Services) that exist, on ports they have.
func TestSelectors(t *testing.T) {
	for dir := range kustomizations {
		r := render(t, dir)
		services := map[string]object{}
		for _, o := range r.objects {
			where := fmt.Sprintf("%s: %s %s", dir, o.kind(), o.name())
			switch o.kind() {
			case "Service":
				services[o.name()] = o
				var spec struct {
					Selector map[string]string `json:"selector"`
					Ports    []struct {
						Name       string `json:"name"`
						TargetPort any    `json:"targetPort"`
					} `json:"ports"`
				}
				o.decode(t, &spec, "spec")
				ws := r.selected(spec.Selector)
				if len(ws) == 0 {
					t.Errorf("%s selects no pods", where)
				}
				for _, p := range spec.Ports {
					for _, w := range ws {
						if !slices.ContainsFunc(w.pod.Containers, func(c container) bool { return c.hasPort(p.TargetPort) }) {
							t.Errorf("%s: port %s: %s %s has no port %v", where, p.Name, w.kind, w.name, p.TargetPort)
						}
					}
				}
			case "PodDisruptionBudget":
				var sel map[string]string
				o.decode(t, &sel, "spec", "selector", "matchLabels")
				if len(r.selected(sel)) == 0 {
					t.Errorf("%s selects no pods", where)
				}
			case "NetworkPolicy":
				var spec struct {
					PodSelector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"podSelector"`
					Ingress []struct {
						Ports []struct {
							Port any `json:"port"`
						} `json:"ports"`
					} `json:"ingress"`
				}
				o.decode(t, &spec, "spec")
				ws := r.selected(spec.PodSelector.MatchLabels)
				if len(ws) == 0 {
					t.Errorf("%s selects no pods", where)
				}
				for _, in := range spec.Ingress {
					for _, p := range in.Ports {
						for _, w := range ws {
							if !slices.ContainsFunc(w.pod.Containers, func(c container) bool { return c.hasPort(p.Port) }) {
								if _, named := p.Port.(string); named {
									t.Errorf("%s: ingress port %v is not a port of %s %s", where, p.Port, w.kind, w.name)
								}
							}
						}
					}
				}
			}
		}
		for _, o := range r.objects {
			if o.kind() != "ServiceMonitor" {
				continue
			}
			var spec struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				Endpoints []struct {
					Port string `json:"port"`
					Path string `json:"path"`
				} `json:"endpoints"`
			}
			o.decode(t, &spec, "spec")
			n := 0
			for _, s := range services {
				var labels map[string]string
				s.decode(t, &labels, "metadata", "labels")
				if !matches(spec.Selector.MatchLabels, labels) {
					continue
				}
				n++
				for _, e := range spec.Endpoints {
					if !slices.ContainsFunc(servicePorts(t, s), func(p servicePort) bool { return p.Name == e.Port }) || e.Path != "/metrics" {
						t.Errorf("%s: ServiceMonitor %s: Service %s has no port %q, or path %q is not /metrics", dir, o.name(), s.name(), e.Port, e.Path)
					}
				}
			}
			if n != 1 {
				t.Errorf("%s: ServiceMonitor %s selects %d Services, want 1 (each pod scraped once)", dir, o.name(), n)
			}
		}
	}
}

type servicePort struct {
	Name string `json:"name"`
	Port int    `json:"port"`
}

func servicePorts(t *testing.T, svc object) []servicePort {
	t.Helper()
	var ps []servicePort
	svc.decode(t, &ps, "spec", "ports")
	return ps
}

// prefixdServe returns the base's serve container and its flag values.
func prefixdServe(t *testing.T, r rendering) (container, map[string]string) {
	t.Helper()
	w, ok := r.workload("Deployment", "prefixd")
	if !ok || len(w.pod.Containers) != 1 {
		t.Fatalf("%s: no Deployment prefixd with one container", r.dir)
	}
	c := w.pod.Containers[0]
	sub, values := checkInvocation(t, r.dir, c.Args, c.envNames())
	if sub != "serve" {
		t.Fatalf("%s: Deployment prefixd runs prefixd %s, want serve", r.dir, sub)
	}
	return c, values
}

// TestBaseDeployment: what the issue asks of the base, beyond well-formed
// objects: replicas, peer bootstrap through the headless Service, probes,
// resources, the listen port, the etcd members.
func TestBaseDeployment(t *testing.T) {
	r := render(t, "kubernetes/base")
	w, _ := r.workload("Deployment", "prefixd")
	if w.replicas < 2 {
		t.Errorf("prefixd replicas %d, want at least 2", w.replicas)
	}
	c, flags := prefixdServe(t, r)
	_, port, _ := strings.Cut(flags["listen"], ":")
	if !c.hasPort("http") || !c.hasPort(float64(atoi(t, port))) {
		t.Errorf("--listen=%s is not the container's port http %v", flags["listen"], c.Ports)
	}
	// The replicas share bookings: on the container's port sync, at the
	// pod's address (a loopback one would reach no other pod).
	_, syncPort, _ := strings.Cut(flags["replica-sync-listen"], ":")
	if syncPort == "" || !c.hasPort("sync") || !c.hasPort(float64(atoi(t, syncPort))) || flags["replica-advertise"] != "$(POD_IP):"+syncPort {
		t.Errorf("--replica-sync-listen=%s --replica-advertise=%s: want :<port sync> and $(POD_IP):<that port>", flags["replica-sync-listen"], flags["replica-advertise"])
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/health" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/ready" {
		t.Errorf("want liveness on /health and readiness on /ready")
	}
	var cs []struct {
		Resources struct {
			Requests map[string]string `json:"requests"`
			Limits   map[string]string `json:"limits"`
		} `json:"resources"`
	}
	r.find("Deployment", "prefixd").decode(t, &cs, "spec", "template", "spec", "containers")
	if res := cs[0].Resources; res.Requests["cpu"] == "" || res.Requests["memory"] == "" || res.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", res)
	}
	if flags["api-token"] == "" {
		t.Errorf("no API token given (PREFIXD_API_TOKEN from a Secret)")
	}

	// --peers=dns+http://<headless service>.$(POD_NAMESPACE).svc:<port>
	peers := regexp.MustCompile(`^dns\+http://([a-z0-9-]+)\.\$\(POD_NAMESPACE\)\.svc:(\d+)$`).FindStringSubmatch(flags["peers"])
	if peers == nil {
		t.Fatalf("--peers=%q: want dns+http://<service>.$(POD_NAMESPACE).svc:<port>", flags["peers"])
	}
	svc := r.find("Service", peers[1])
	if svc == nil || svc.str("spec", "clusterIP") != "None" || svc.get("spec", "publishNotReadyAddresses") != false {
		t.Errorf("Service %s: want headless, without not-ready addresses", peers[1])
	} else if !slices.ContainsFunc(servicePorts(t, svc), func(p servicePort) bool { return strconv.Itoa(p.Port) == peers[2] }) {
		t.Errorf("Service %s has no port %s", peers[1], peers[2])
	}

	// --etcd-endpoints name every member of the etcd StatefulSet.
	ss, ok := r.workload("StatefulSet", "etcd")
	if !ok || ss.replicas != 3 {
		t.Fatalf("want a 3-member etcd StatefulSet")
	}
	etcdSvc := r.find("StatefulSet", "etcd").str("spec", "serviceName")
	var want, cluster []string
	for i := range ss.replicas {
		want = append(want, fmt.Sprintf("http://etcd-%d.%s.$(POD_NAMESPACE).svc:2379", i, etcdSvc))
		cluster = append(cluster, fmt.Sprintf("etcd-%d=http://etcd-%d.%s.$(POD_NAMESPACE).svc:2380", i, i, etcdSvc))
	}
	if got := flags["etcd-endpoints"]; got != strings.Join(want, ",") {
		t.Errorf("--etcd-endpoints=%s, want %s", got, strings.Join(want, ","))
	}
	if got := ss.pod.Containers[0].env("ETCD_INITIAL_CLUSTER"); got != strings.Join(cluster, ",") {
		t.Errorf("ETCD_INITIAL_CLUSTER=%s, want %s", got, strings.Join(cluster, ","))
	}
	for _, kind := range []string{"PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"} {
		if r.find(kind, "prefixd") == nil {
			t.Errorf("no %s prefixd", kind)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// TestExternalEtcdOverlay: no etcd in the cluster; TLS files from the
// mounted Secret.
func TestExternalEtcdOverlay(t *testing.T) {
	r := render(t, "kubernetes/overlays/external-etcd")
	for _, o := range r.objects {
		if strings.HasPrefix(o.name(), "etcd") || o.name() == "prefixd-etcd" {
			t.Errorf("%s %s is still rendered", o.kind(), o.name())
		}
	}
	c, flags := prefixdServe(t, r)
	for _, ep := range strings.Split(flags["etcd-endpoints"], ",") {
		if !strings.HasPrefix(ep, "https://") {
			t.Errorf("etcd endpoint %s is not https", ep)
		}
	}
	for _, f := range []string{"etcd-ca", "etcd-cert", "etcd-key"} {
		if !slices.ContainsFunc(c.VolumeMounts, func(m struct {
			Name      string `json:"name"`
			MountPath string `json:"mountPath"`
		}) bool {
			return flags[f] != "" && filepath.Dir(flags[f]) == m.MountPath
		}) {
			t.Errorf("--%s=%s is not in a mounted volume", f, flags[f])
		}
	}
}

// TestVLLMExample: the sidecar registers what vLLM publishes: the same
// model, block size, KV-event endpoints and topic; the ports are exposed
// and inside prefixd's NetworkPolicy range.
func TestVLLMExample(t *testing.T) {
	r := render(t, "kubernetes/examples/vllm")
	w, ok := r.workload("StatefulSet", "vllm")
	if !ok || len(w.pod.Containers) != 2 {
		t.Fatalf("want a StatefulSet vllm with the engine and the sidecar")
	}
	engine, side := w.pod.Containers[0], w.pod.Containers[1]
	sub, flags := checkInvocation(t, "sidecar", side.Args, side.envNames())
	if sub != "sidecar" {
		t.Fatalf("second container runs prefixd %s, want sidecar", sub)
	}
	vflags := map[string]string{}
	for _, a := range engine.Args {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			vflags[k[2:]] = v
		}
	}
	var cfg struct {
		Enable         bool   `json:"enable_kv_cache_events"`
		Publisher      string `json:"publisher"`
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
		Topic          string `json:"topic"`
	}
	if err := json.Unmarshal([]byte(vflags["kv-events-config"]), &cfg); err != nil {
		t.Fatalf("--kv-events-config %q: %v", vflags["kv-events-config"], err)
	}
	if !cfg.Enable || cfg.Publisher != "zmq" {
		t.Errorf("kv-events-config %+v: want enable_kv_cache_events and publisher zmq", cfg)
	}
	for _, pair := range [][2]string{
		{cfg.Endpoint, flags["events-endpoint"]}, {cfg.ReplayEndpoint, flags["replay-endpoint"]}, {cfg.Topic, flags["topic"]},
		{vflags["served-model-name"], flags["model"]}, {vflags["block-size"], flags["block-size"]},
	} {
		if pair[0] == "" || pair[0] != pair[1] {
			t.Errorf("vLLM has %q where the sidecar has %q", pair[0], pair[1])
		}
	}
	if !strings.Contains(flags["worker-id"], "$(POD_INDEX)") || r.find("StatefulSet", "vllm").get("spec", "ordinals", "start") == nil {
		t.Errorf("--worker-id=%s: want the pod index with ordinals starting above 0", flags["worker-id"])
	}
	base := render(t, "kubernetes/base")
	var egress struct {
		Egress []struct {
			Ports []struct {
				Port    int `json:"port"`
				EndPort int `json:"endPort"`
			} `json:"ports"`
		} `json:"egress"`
	}
	base.find("NetworkPolicy", "prefixd").decode(t, &egress, "spec")
	for _, ep := range []string{cfg.Endpoint, cfg.ReplayEndpoint} {
		port := atoi(t, ep[strings.LastIndexByte(ep, ':')+1:])
		if !engine.hasPort(float64(port)) {
			t.Errorf("vLLM container does not expose %d (%s)", port, ep)
		}
		reachable := false
		for _, e := range egress.Egress {
			for _, p := range e.Ports {
				reachable = reachable || p.Port == port || (p.Port <= port && port <= p.EndPort)
			}
		}
		if !reachable {
			t.Errorf("NetworkPolicy prefixd does not let prefixd reach port %d", port)
		}
	}
}

// TestProxyExample: the proxy reaches prefixd serve's Service and the
// vLLM example's OpenAI port, and the policies on both sides let it.
func TestProxyExample(t *testing.T) {
	r := render(t, "kubernetes/examples/proxy")
	w, ok := r.workload("Deployment", "prefixd-proxy")
	if !ok || len(w.pod.Containers) != 1 {
		t.Fatalf("want a Deployment prefixd-proxy with one container")
	}
	c := w.pod.Containers[0]
	sub, flags := checkInvocation(t, "proxy", c.Args, c.envNames())
	if sub != "proxy" {
		t.Fatalf("the container runs prefixd %s, want proxy", sub)
	}
	base := render(t, "kubernetes/base")
	var svc struct {
		Ports []struct {
			Port int `json:"port"`
		} `json:"ports"`
	}
	base.find("Service", "prefixd").decode(t, &svc, "spec")
	if want := fmt.Sprintf("http://prefixd.prefixd.svc:%d", svc.Ports[0].Port); flags["server"] != want {
		t.Errorf("--server=%s, want %s (the base Service)", flags["server"], want)
	}
	listen := flags["listen"]
	if port := atoi(t, listen[strings.LastIndexByte(listen, ':')+1:]); !c.hasPort(float64(port)) {
		t.Errorf("--listen=%s: the container does not expose %d", listen, port)
	}
	if w.labels["prefixd.io/api-client"] != "true" {
		t.Errorf("the proxy pods lack prefixd.io/api-client=true, which prefixd's NetworkPolicy admits")
	}
	engines := render(t, "kubernetes/examples/vllm")
	vllm, _ := engines.workload("StatefulSet", "vllm")
	if vllm.labels["prefixd.io/engine"] != "true" || !vllm.pod.Containers[0].hasPort(float64(8000)) {
		t.Errorf("the vLLM example's pods are not prefixd.io/engine=true with the OpenAI port 8000")
	}
	var egress struct {
		Egress []struct {
			To []struct {
				PodSelector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"podSelector"`
			} `json:"to"`
			Ports []struct {
				Port int `json:"port"`
			} `json:"ports"`
		} `json:"egress"`
	}
	r.find("NetworkPolicy", "prefixd-proxy").decode(t, &egress, "spec")
	reach := func(label, value string, port int) bool {
		for _, e := range egress.Egress {
			for _, to := range e.To {
				for _, p := range e.Ports {
					if to.PodSelector.MatchLabels[label] == value && p.Port == port {
						return true
					}
				}
			}
		}
		return false
	}
	if !reach("app.kubernetes.io/name", "prefixd", svc.Ports[0].Port) || !reach("prefixd.io/engine", "true", 8000) {
		t.Errorf("NetworkPolicy prefixd-proxy does not let the proxy reach prefixd's API and the engines' port 8000: %+v", egress)
	}
}

// TestSmokeOverlay: the mock engines register in the in-cluster etcd on
// the ports the Service and the Job use.
func TestSmokeOverlay(t *testing.T) {
	r := render(t, "kubernetes/overlays/smoke")
	w, ok := r.workload("Deployment", "prefixd-mocker")
	if !ok || w.replicas != 1 {
		t.Fatalf("want one prefixd-mocker replica (more would register the same worker ids)")
	}
	c := w.pod.Containers[0]
	sub, flags := checkInvocation(t, "mocker", c.Args, c.envNames())
	if sub != "mocker" {
		t.Fatalf("prefixd-mocker runs prefixd %s", sub)
	}
	n, first := atoi(t, flags["engines"]), atoi(t, flags["http-port"])
	for i := range n {
		if !c.hasPort(float64(first + i)) {
			t.Errorf("engine %d's port %d is not a container port", i+1, first+i)
		}
	}
	_, serve := prefixdServe(t, r)
	if flags["etcd-endpoints"] != serve["etcd-endpoints"] {
		t.Errorf("mocker registers in %s, prefixd reads %s", flags["etcd-endpoints"], serve["etcd-endpoints"])
	}
	if job := r.find("Job", "prefixd-smoke"); job == nil || !strings.Contains(fmt.Sprint(job.get("spec", "template", "spec", "containers")), "http://prefixd-mocker:"+flags["http-port"]) {
		t.Errorf("the smoke Job does not call engine 1 at prefixd-mocker:%s", flags["http-port"])
	}
}
