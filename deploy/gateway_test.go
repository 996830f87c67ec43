package deploy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/prefixd/prefixd/catalog"
)

// The Gateway API Inference Extension release whose InferencePool CRD the
// gateway example is validated against (go.mod requires the same).
const (
	gieModule  = "sigs.k8s.io/gateway-api-inference-extension"
	gieVersion = "v1.6.2"
	gieCRD     = "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
)

// The gRPC health services of the EPP protocol (GIE
// docs/proposals/004-endpoint-picker-protocol, "Health Checking").
const (
	healthLiveness  = "liveness"
	healthReadiness = "readiness"
	healthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// crdValidator checks a custom resource as the API server does on create,
// with Kubernetes' own code for each step (k8s.io/apiextensions-apiserver).
type crdValidator struct {
	group, version, kind string
	structural           *structuralschema.Structural
	schema               apiservervalidation.SchemaValidator
	rules                *cel.Validator
}

var inferencePoolCRD = sync.OnceValues(loadInferencePoolCRD)

// loadInferencePoolCRD reads the InferencePool CRD shipped in the GIE
// module at gieVersion (from the module cache, where the build put it) and
// compiles its v1 schema and x-kubernetes-validations rules.
func loadInferencePoolCRD() (*crdValidator, error) {
	cmd := exec.Command("go", "list", "-m", "-json", gieModule)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m %s: %w", gieModule, err)
	}
	var mod struct{ Version, Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("go list -m %s: %w", gieModule, err)
	}
	if mod.Version != gieVersion || mod.Dir == "" {
		return nil, fmt.Errorf("go.mod has %s %s (module dir %q), want %s in the module cache", gieModule, mod.Version, mod.Dir, gieVersion)
	}
	raw, err := os.ReadFile(filepath.Join(mod.Dir, gieCRD))
	if err != nil {
		return nil, err
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		return nil, fmt.Errorf("%s: %w", gieCRD, err)
	}
	if got := crd.Annotations["inference.networking.k8s.io/bundle-version"]; got != gieVersion {
		return nil, fmt.Errorf("%s: bundle-version %q, want %s", gieCRD, got, gieVersion)
	}
	v := &crdValidator{group: crd.Spec.Group, kind: crd.Spec.Names.Kind}
	var props *apiextensionsv1.JSONSchemaProps
	for _, ver := range crd.Spec.Versions {
		if ver.Served && ver.Storage && ver.Schema != nil {
			v.version, props = ver.Name, ver.Schema.OpenAPIV3Schema
		}
	}
	if props == nil {
		return nil, fmt.Errorf("%s: no served storage version with a schema", gieCRD)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(props, &internal, nil); err != nil {
		return nil, fmt.Errorf("%s: convert schema: %w", gieCRD, err)
	}
	if v.structural, err = structuralschema.NewStructural(&internal); err != nil {
		return nil, fmt.Errorf("%s: structural schema: %w", gieCRD, err)
	}
	if errs := structuralschema.ValidateStructural(nil, v.structural); len(errs) > 0 {
		return nil, fmt.Errorf("%s: not a structural schema: %v", gieCRD, errs.ToAggregate())
	}
	// The API server applies the defaults as pruned of unknown fields.
	if err := defaulting.PruneDefaults(v.structural); err != nil {
		return nil, fmt.Errorf("%s: defaults: %w", gieCRD, err)
	}
	if v.schema, _, err = apiservervalidation.NewSchemaValidator(&internal); err != nil {
		return nil, fmt.Errorf("%s: schema validator: %w", gieCRD, err)
	}
	v.rules = cel.NewValidator(v.structural, true, celconfig.PerCallLimit)
	if v.rules == nil {
		return nil, fmt.Errorf("%s: no x-kubernetes-validations rules compiled", gieCRD)
	}
	return v, nil
}

func inferencePoolValidator(t *testing.T) *crdValidator {
	t.Helper()
	v, err := inferencePoolCRD()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// validate runs on a copy of obj what the API server runs when it is
// created, in its order: the type (the URL the API server routes by), the
// unknown fields (refused, as kubectl's default strict field validation
// does), object meta, the defaults, the OpenAPI schema, the name, the list
// types, then the x-kubernetes-validations (CEL) rules unless an earlier
// error blocks them.
func (v *crdValidator) validate(obj object) field.ErrorList {
	raw, err := json.Marshal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	// Integers as int64, as the API server decodes them.
	var u map[string]any
	if err := utiljson.Unmarshal(raw, &u); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	var errs field.ErrorList
	if got, want := object(u).str("apiVersion"), v.group+"/"+v.version; got != want {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), got, "the CRD serves "+want))
	}
	if got := object(u).kind(); got != v.kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), got, "the CRD's kind is "+v.kind))
	}
	if len(errs) > 0 {
		return errs
	}
	for _, p := range pruning.PruneWithOptions(u, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, field.Forbidden(field.NewPath(p), "unknown field"))
	}
	if err := objectmeta.Coerce(nil, u, v.structural, true, false); err != nil {
		errs = append(errs, err)
	}
	defaulting.Default(u, v.structural)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, u, v.schema)...)
	errs = append(errs, apivalidation.ValidateObjectMetaAccessor(&unstructured.Unstructured{Object: u}, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, u)...)
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return append(errs, field.Invalid(nil, nil, "x-kubernetes-validations not checked: the object is invalid"))
		}
	}
	ruleErrs, _ := v.rules.Validate(context.Background(), nil, v.structural, u, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, ruleErrs...)
}

// clone deep-copies objects, so that a test may change them.
func clone(t *testing.T, objects []object) []object {
	t.Helper()
	raw, err := json.Marshal(objects)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// set changes the value at path in o (a key, or an index into a list),
// creating maps on the way; a nil value deletes the key.
func set(o object, value any, path ...any) {
	var cur any = map[string]any(o)
	for i, p := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			k := p.(string)
			if last {
				if value == nil {
					delete(c, k)
				} else {
					c[k] = value
				}
				return
			}
			if _, ok := c[k]; !ok {
				c[k] = map[string]any{}
			}
			cur = c[k]
		case []any:
			if last {
				c[p.(int)] = value
				return
			}
			cur = c[p.(int)]
		default:
			panic(fmt.Sprintf("set %v: %T at %v", path, cur, p))
		}
	}
}

// flagValues reads `--flag=value` arguments (after the subcommand).
func flagValues(args []string) map[string]string {
	out := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			out[k[2:]] = v
		} else if strings.HasPrefix(a, "--") {
			out[a[2:]] = "true"
		}
	}
	return out
}

// portOf is the port of a listen address or URL (":9002", "http://h:8000").
func portOf(addr string) int {
	n, err := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
	if err != nil {
		return -1
	}
	return n
}

// containerPortNumber resolves a port (a name or a number) of c.
func (c container) containerPortNumber(p any) int {
	for _, cp := range c.Ports {
		switch v := p.(type) {
		case string:
			if cp.Name == v {
				return cp.ContainerPort
			}
		case int:
			if cp.ContainerPort == v {
				return cp.ContainerPort
			}
		}
	}
	return -1
}

// prefixdSub finds the containers of ws that run `prefixd <sub>`.
func prefixdSub(ws []workload, sub string) (out []container) {
	for _, w := range ws {
		for _, c := range w.pod.Containers {
			if strings.HasPrefix(c.Image, prefixdImage+":") && len(c.Args) > 0 && c.Args[0] == sub {
				out = append(out, c)
			}
		}
	}
	return out
}

// admits reports whether a NetworkPolicy's ingress rules let pods with
// labels (from another namespace when anyNamespace) reach port (a port
// name, or a number).
func admits(t *testing.T, policy object, labels map[string]string, anyNamespace bool, port any) bool {
	t.Helper()
	var spec struct {
		Ingress []struct {
			From []struct {
				NamespaceSelector *struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"namespaceSelector"`
				PodSelector *struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"podSelector"`
			} `json:"from"`
			Ports []struct {
				Port    any `json:"port"`
				EndPort int `json:"endPort"`
			} `json:"ports"`
		} `json:"ingress"`
	}
	policy.decode(t, &spec, "spec")
	for _, in := range spec.Ingress {
		from := len(in.From) == 0
		for _, f := range in.From {
			nsOK := f.NamespaceSelector == nil && !anyNamespace || f.NamespaceSelector != nil && len(f.NamespaceSelector.MatchLabels) == 0
			podOK := f.PodSelector == nil || matches(f.PodSelector.MatchLabels, labels)
			from = from || nsOK && podOK
		}
		portOK := len(in.Ports) == 0
		for _, p := range in.Ports {
			switch v := p.Port.(type) {
			case string:
				portOK = portOK || v == port
			case float64:
				n, ok := port.(int)
				portOK = portOK || ok && (int(v) == n || int(v) <= n && n <= p.EndPort)
			}
		}
		if from && portOK {
			return true
		}
	}
	return false
}

// gatewayProblems checks what the gateway example must hold beyond each
// object being well formed: the InferencePool (valid for the CRD) selects
// the engines on the port their sidecars register; its endpointPickerRef
// names the EPP Service on the port where `prefixd serve --epp-listen`
// listens, with the health services probed there; the HTTPRoute sends to
// the pool through the Gateway; the network policies let the EPP reach
// etcd and the engines' KV events. base is the base's rendering (etcd).
func gatewayProblems(t *testing.T, r, base rendering) []string {
	t.Helper()
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	var pools []object
	for _, o := range r.objects {
		if o.kind() == "InferencePool" {
			pools = append(pools, o)
		}
	}
	if len(pools) != 1 {
		fail("%d InferencePools, want 1", len(pools))
		return problems
	}
	poolObj := pools[0]
	for _, e := range inferencePoolValidator(t).validate(poolObj) {
		fail("InferencePool %s: %v", poolObj.name(), e)
	}
	raw, _ := json.Marshal(poolObj)
	var pool inferencev1.InferencePool
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pool); err != nil {
		fail("InferencePool %s: %v", poolObj.name(), err)
		return problems
	}
	ref := pool.Spec.EndpointPickerRef
	if ref == nil || ref.Port == nil {
		fail("InferencePool %s: no endpointPickerRef with a port", pool.Name)
		return problems
	}
	if ref.FailureMode != inferencev1.EndpointPickerFailOpen && ref.FailureMode != inferencev1.EndpointPickerFailClose {
		fail("InferencePool %s: failureMode %q: state FailOpen or FailClose", pool.Name, ref.FailureMode)
	}
	var group inferencev1.Group
	if ref.Group != nil {
		group = *ref.Group
	}
	if group != "" || cmp.Or(ref.Kind, "Service") != "Service" {
		fail("InferencePool %s: endpointPickerRef is %s/%s, want a core Service", pool.Name, group, ref.Kind)
	}

	// The pool's pods are engines with a sidecar that registers
	// <pod IP>:<target port>: the EPP's answers are addresses of the pool.
	poolSelector := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		poolSelector[string(k)] = string(v)
	}
	engines := r.selected(poolSelector)
	if len(engines) == 0 {
		fail("InferencePool %s selects no pods", pool.Name)
	}
	eppContainers := prefixdSub(r.workloads, "serve")
	if len(eppContainers) != 1 {
		fail("%d containers run prefixd serve, want 1 (the EPP)", len(eppContainers))
		return problems
	}
	epp := eppContainers[0]
	eppFlags := flagValues(epp.Args[1:])
	eppGroup := cmp.Or(eppFlags["epp-routing-group"], catalog.DefaultRoutingGroup)
	for _, w := range engines {
		sidecars := prefixdSub([]workload{w}, "sidecar")
		if len(sidecars) != 1 {
			fail("%s %s: in the pool without a prefixd sidecar: the EPP would never pick it", w.kind, w.name)
			continue
		}
		sf := flagValues(sidecars[0].Args[1:])
		port := portOf(sf["engine-url"])
		if !slices.ContainsFunc(pool.Spec.TargetPorts, func(p inferencev1.Port) bool { return int(p.Number) == port }) {
			fail("%s %s: the sidecar registers --engine-url=%s, whose port is not a targetPort of InferencePool %s %v", w.kind, w.name, sf["engine-url"], pool.Name, pool.Spec.TargetPorts)
		}
		if !slices.ContainsFunc(w.pod.Containers, func(c container) bool { return c.hasPort(float64(port)) }) {
			fail("%s %s: no container exposes the engine port %d", w.kind, w.name, port)
		}
		if g := cmp.Or(sf["routing-group"], catalog.DefaultRoutingGroup); g != eppGroup {
			fail("%s %s: the sidecar registers routing group %q, the EPP picks in %q", w.kind, w.name, g, eppGroup)
		}
	}

	// endpointPickerRef → Service port → the EPP's --epp-listen.
	svc := r.find("Service", string(ref.Name))
	if svc == nil {
		fail("endpointPickerRef names Service %s, which is not in the example", ref.Name)
		return problems
	}
	type svcPort struct {
		Port        int    `json:"port"`
		TargetPort  any    `json:"targetPort"`
		AppProtocol string `json:"appProtocol"`
	}
	var svcSpec struct {
		Selector map[string]string `json:"selector"`
		Ports    []svcPort         `json:"ports"`
	}
	svc.decode(t, &svcSpec, "spec")
	i := slices.IndexFunc(svcSpec.Ports, func(p svcPort) bool { return p.Port == int(ref.Port.Number) })
	if i < 0 {
		fail("Service %s has no port %d (endpointPickerRef's)", svc.name(), ref.Port.Number)
		return problems
	}
	sp := svcSpec.Ports[i]
	tls := eppFlags["epp-self-signed"] == "true" || eppFlags["epp-cert-file"] != ""
	if want := "kubernetes.io/h2c"; !tls && sp.AppProtocol != want {
		fail("Service %s port %d: appProtocol %q, want %s (plaintext gRPC)", svc.name(), sp.Port, sp.AppProtocol, want)
	}
	if tls && sp.AppProtocol == "kubernetes.io/h2c" {
		fail("Service %s port %d: appProtocol kubernetes.io/h2c, but the EPP serves TLS", svc.name(), sp.Port)
	}
	selected := r.selected(svcSpec.Selector)
	if len(selected) != 1 || len(prefixdSub(selected, "serve")) != 1 {
		fail("Service %s selects %d workloads, want the EPP's alone", svc.name(), len(selected))
	}
	listen, ok := eppFlags["epp-listen"]
	if !ok || listen == "" {
		fail("the EPP's prefixd serve has no --epp-listen")
	}
	var targetPort any = sp.Port
	switch tp := sp.TargetPort.(type) {
	case string:
		targetPort = tp
	case float64:
		targetPort = int(tp)
	}
	if n := epp.containerPortNumber(targetPort); n != portOf(listen) {
		fail("Service %s port %d targets container port %v (%d), but prefixd serve --epp-listen=%s", svc.name(), sp.Port, targetPort, n, listen)
	}
	probes := map[string]*probe{"liveness": epp.LivenessProbe, "readiness": epp.ReadinessProbe}
	wantService := map[string][]string{"liveness": {healthLiveness}, "readiness": {healthReadiness, healthExtProc}}
	for name, p := range probes {
		switch {
		case p == nil:
			fail("the EPP has no %s probe", name)
		case tls:
			if p.GRPC != nil {
				fail("the EPP's %s probe is grpc, which the kubelet cannot speak over TLS", name)
			}
		case p.GRPC == nil || p.GRPC.Port != portOf(listen) || p.GRPC.Service == nil || !slices.Contains(wantService[name], *p.GRPC.Service):
			fail("the EPP's %s probe: want grpc on %d with service %v", name, portOf(listen), wantService[name])
		}
	}

	// HTTPRoute → InferencePool, through a Gateway of the example.
	routes := 0
	for _, o := range r.objects {
		if o.kind() != "HTTPRoute" {
			continue
		}
		var spec struct {
			ParentRefs []struct {
				Group string `json:"group"`
				Kind  string `json:"kind"`
				Name  string `json:"name"`
			} `json:"parentRefs"`
			Rules []struct {
				BackendRefs []struct {
					Group string `json:"group"`
					Kind  string `json:"kind"`
					Name  string `json:"name"`
				} `json:"backendRefs"`
			} `json:"rules"`
		}
		o.decode(t, &spec, "spec")
		for _, p := range spec.ParentRefs {
			if cmp.Or(p.Group, "gateway.networking.k8s.io") != "gateway.networking.k8s.io" || cmp.Or(p.Kind, "Gateway") != "Gateway" || r.find("Gateway", p.Name) == nil {
				fail("HTTPRoute %s: parentRef %+v is not a Gateway of the example", o.name(), p)
			}
		}
		if len(spec.ParentRefs) == 0 {
			fail("HTTPRoute %s has no parentRefs", o.name())
		}
		for _, rule := range spec.Rules {
			for _, b := range rule.BackendRefs {
				if b.Group != inferencev1.GroupName || b.Kind != "InferencePool" || b.Name != pool.Name {
					fail("HTTPRoute %s: backendRef %s/%s %s, want %s/InferencePool %s", o.name(), b.Group, b.Kind, b.Name, inferencev1.GroupName, pool.Name)
				} else {
					routes++
				}
			}
		}
	}
	if routes == 0 {
		fail("no HTTPRoute sends to InferencePool %s", pool.Name)
	}
	for _, o := range r.objects {
		if o.kind() == "Gateway" && (o.str("spec", "gatewayClassName") == "" || o.get("spec", "listeners") == nil) {
			fail("Gateway %s: want a gatewayClassName and listeners", o.name())
		}
	}

	// The EPP reads the base's etcd and the engines' KV events.
	var eppWorkload workload
	for _, w := range r.workloads {
		if len(prefixdSub([]workload{w}, "serve")) == 1 {
			eppWorkload = w
		}
	}
	if p := base.find("NetworkPolicy", "etcd"); p == nil || !admits(t, p, eppWorkload.labels, true, "client") {
		fail("the base's NetworkPolicy etcd does not admit the EPP's pods %v from another namespace", eppWorkload.labels)
	}
	var members []string
	for i := range 3 {
		members = append(members, fmt.Sprintf("http://etcd-%d.etcd.prefixd.svc:2379", i))
	}
	if got := eppFlags["etcd-endpoints"]; got != strings.Join(members, ",") {
		fail("the EPP's --etcd-endpoints=%s, want the base's members %s", got, strings.Join(members, ","))
	}
	for _, w := range engines {
		for _, np := range r.objects {
			var sel map[string]string
			if np.kind() != "NetworkPolicy" {
				continue
			}
			np.decode(t, &sel, "spec", "podSelector", "matchLabels")
			if !matches(sel, w.labels) {
				continue
			}
			for _, side := range prefixdSub([]workload{w}, "sidecar") {
				sf := flagValues(side.Args[1:])
				for _, ep := range []string{sf["events-endpoint"], sf["replay-endpoint"]} {
					if !admits(t, np, eppWorkload.labels, false, portOf(ep)) {
						fail("NetworkPolicy %s does not let the EPP reach %s %s's port %d", np.name(), w.kind, w.name, portOf(ep))
					}
				}
			}
		}
	}
	for _, np := range r.objects {
		var sel map[string]string
		if np.kind() == "NetworkPolicy" {
			np.decode(t, &sel, "spec", "podSelector", "matchLabels")
		}
		if np.kind() == "NetworkPolicy" && matches(sel, eppWorkload.labels) && len(sel) > 0 && !admits(t, np, map[string]string{}, true, targetPort) {
			fail("NetworkPolicy %s does not let gateways reach the EPP's port %v", np.name(), targetPort)
		}
	}

	// Two or more replicas, all serving: each shares its bookings on its
	// port sync with every prefixd in etcd (the base's daemons, in another
	// namespace, included), and a PodDisruptionBudget keeps one serving.
	if eppWorkload.replicas < 2 {
		fail("the EPP runs %d replica(s), want 2 or more sharing their bookings", eppWorkload.replicas)
	}
	_, syncPort, _ := strings.Cut(eppFlags["replica-sync-listen"], ":")
	if syncPort == "" || !epp.hasPort("sync") || epp.containerPortNumber("sync") != portOf(eppFlags["replica-sync-listen"]) || eppFlags["replica-advertise"] != "$(POD_IP):"+syncPort {
		fail("the EPP's --replica-sync-listen=%s --replica-advertise=%s: want :<container port sync> and $(POD_IP):<that port>", eppFlags["replica-sync-listen"], eppFlags["replica-advertise"])
	}
	pdb := false
	for _, o := range r.objects {
		var spec struct {
			MinAvailable *int `json:"minAvailable"`
			Selector     struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
		}
		if o.kind() != "PodDisruptionBudget" {
			continue
		}
		o.decode(t, &spec, "spec")
		if matches(spec.Selector.MatchLabels, eppWorkload.labels) && spec.MinAvailable != nil && *spec.MinAvailable >= 1 && *spec.MinAvailable < eppWorkload.replicas {
			pdb = true
		}
	}
	if !pdb {
		fail("no PodDisruptionBudget keeps 1 to %d of the EPP's %d replicas available", eppWorkload.replicas-1, eppWorkload.replicas)
	}
	var daemon map[string]string
	for _, w := range base.workloads {
		if len(prefixdSub([]workload{w}, "serve")) == 1 {
			daemon = w.labels
		}
	}
	for _, np := range r.objects {
		var sel map[string]string
		if np.kind() == "NetworkPolicy" {
			np.decode(t, &sel, "spec", "podSelector", "matchLabels")
		}
		if np.kind() == "NetworkPolicy" && matches(sel, eppWorkload.labels) && len(sel) > 0 {
			if !admits(t, np, eppWorkload.labels, false, "sync") || !admits(t, np, daemon, true, "sync") {
				fail("NetworkPolicy %s does not let the other EPP replica and the base's daemons reach port sync", np.name())
			}
		}
	}
	if p := base.find("NetworkPolicy", "prefixd"); p == nil || !admits(t, p, eppWorkload.labels, true, "sync") {
		fail("the base's NetworkPolicy prefixd does not let the EPP's pods %v reach port sync", eppWorkload.labels)
	}
	return problems
}

// TestGatewayExample: the InferencePool of examples/gateway is valid for
// the InferencePool CRD of GIE v1.6.2, and the example holds together (see
// gatewayProblems).
func TestGatewayExample(t *testing.T) {
	r := render(t, "kubernetes/examples/gateway")
	for _, p := range gatewayProblems(t, r, render(t, "kubernetes/base")) {
		t.Error(p)
	}
}

// TestGatewayExampleProblems: each break of the example is reported.
func TestGatewayExampleProblems(t *testing.T) {
	r := render(t, "kubernetes/examples/gateway")
	base := render(t, "kubernetes/base")
	find := func(objects []object, kind, name string) object {
		for _, o := range objects {
			if o.kind() == kind && o.name() == name {
				return o
			}
		}
		t.Fatalf("no %s %s", kind, name)
		return nil
	}
	eppArg := func(objects []object, flag, value string) {
		d := find(objects, "Deployment", "prefixd-epp")
		args := d.get("spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"].([]any)
		for i, a := range args {
			if strings.HasPrefix(a.(string), "--"+flag+"=") {
				args[i] = "--" + flag + "=" + value
				return
			}
		}
		t.Fatalf("the EPP has no --%s", flag)
	}
	for _, tc := range []struct {
		name   string
		change func(objects []object)
		want   string
	}{
		{"route to another group", func(o []object) {
			set(find(o, "HTTPRoute", "vllm"), "inference.networking.x-k8s.io", "spec", "rules", 0, "backendRefs", 0, "group")
		}, "backendRef inference.networking.x-k8s.io/InferencePool"},
		{"route to another pool", func(o []object) {
			set(find(o, "HTTPRoute", "vllm"), "other", "spec", "rules", 0, "backendRefs", 0, "name")
		}, "backendRef inference.networking.k8s.io/InferencePool other"},
		{"route to a Service", func(o []object) {
			set(find(o, "HTTPRoute", "vllm"), "Service", "spec", "rules", 0, "backendRefs", 0, "kind")
		}, "/Service vllm"},
		{"route on another Gateway", func(o []object) {
			set(find(o, "HTTPRoute", "vllm"), "other", "spec", "parentRefs", 0, "name")
		}, "is not a Gateway of the example"},
		{"EPP Service on another port", func(o []object) {
			set(find(o, "Service", "prefixd-epp"), float64(9003), "spec", "ports", 0, "port")
		}, "has no port 9002"},
		{"EPP Service not h2c", func(o []object) {
			set(find(o, "Service", "prefixd-epp"), "http", "spec", "ports", 0, "appProtocol")
		}, `appProtocol "http"`},
		{"endpointPickerRef to another Service", func(o []object) {
			set(find(o, "InferencePool", "vllm"), "prefixd", "spec", "endpointPickerRef", "name")
		}, "names Service prefixd"},
		{"--epp-listen on another port", func(o []object) { eppArg(o, "epp-listen", ":9003") }, "--epp-listen=:9003"},
		{"TLS with grpc probes", func(o []object) {
			d := find(o, "Deployment", "prefixd-epp")
			c := d.get("spec", "template", "spec", "containers").([]any)[0].(map[string]any)
			c["args"] = append(c["args"].([]any), "--epp-self-signed")
		}, "cannot speak over TLS"},
		{"readiness on another service", func(o []object) {
			set(find(o, "Deployment", "prefixd-epp"), "inference-extension", "spec", "template", "spec", "containers", 0, "readinessProbe", "grpc", "service")
		}, "readiness probe"},
		{"another routing group", func(o []object) { eppArg(o, "epp-routing-group", "other") }, `the EPP picks in "other"`},
		{"another etcd", func(o []object) { eppArg(o, "etcd-endpoints", "http://etcd:2379") }, "--etcd-endpoints=http://etcd:2379"},
		{"pool on another port", func(o []object) {
			set(find(o, "InferencePool", "vllm"), []any{map[string]any{"number": float64(8001)}}, "spec", "targetPorts")
		}, "not a targetPort"},
		{"pool selecting nothing", func(o []object) {
			set(find(o, "InferencePool", "vllm"), map[string]any{"app": "none"}, "spec", "selector", "matchLabels")
		}, "selects no pods"},
		{"failureMode unstated", func(o []object) {
			set(find(o, "InferencePool", "vllm"), nil, "spec", "endpointPickerRef", "failureMode")
		}, "state FailOpen or FailClose"},
		{"endpointPickerRef to a Deployment", func(o []object) {
			set(find(o, "InferencePool", "vllm"), "apps", "spec", "endpointPickerRef", "group")
			set(find(o, "InferencePool", "vllm"), "Deployment", "spec", "endpointPickerRef", "kind")
		}, "endpointPickerRef is apps/Deployment"},
		{"pool invalid for the CRD", func(o []object) {
			set(find(o, "InferencePool", "vllm"), "Sometimes", "spec", "endpointPickerRef", "failureMode")
		}, "spec.endpointPickerRef.failureMode"},
		{"engines closed to the EPP", func(o []object) {
			np := find(o, "NetworkPolicy", "vllm")
			ingress := np.get("spec", "ingress").([]any)
			set(np, ingress[:len(ingress)-1], "spec", "ingress")
		}, "does not let the EPP reach StatefulSet vllm's port 5557"},
		{"one replica", func(o []object) {
			set(find(o, "Deployment", "prefixd-epp"), float64(1), "spec", "replicas")
		}, "runs 1 replica(s)"},
		{"no budget", func(o []object) {
			set(find(o, "PodDisruptionBudget", "prefixd-epp"), float64(2), "spec", "minAvailable")
		}, "no PodDisruptionBudget keeps"},
		{"sync on another port", func(o []object) { eppArg(o, "replica-sync-listen", ":9092") }, "--replica-sync-listen=:9092"},
		{"replicas closed to each other", func(o []object) {
			np := find(o, "NetworkPolicy", "prefixd-epp")
			ingress := np.get("spec", "ingress").([]any)
			set(np, ingress[:len(ingress)-1], "spec", "ingress")
		}, "reach port sync"},
		{"EPP closed to gateways", func(o []object) {
			set(find(o, "NetworkPolicy", "prefixd-epp"), []any{}, "spec", "ingress")
		}, "does not let gateways reach"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objects := clone(t, r.objects)
			tc.change(objects)
			problems := gatewayProblems(t, newRendering(t, r.dir, objects), base)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("problems %q: none says %q", problems, tc.want)
			}
		})
	}
}

// TestInferencePoolCRD: the CRD validation refuses broken pools, each
// with an error at the field that is wrong, and accepts valid variants.
// Both x-kubernetes-validations rules of the v1.6.2 CRD run through
// Kubernetes' CEL validator: endpointPickerRef "self.kind != 'Service' ||
// has(self.port)" (after the default kind Service) and targetPorts
// "self.all(p1, self.exists_one(p2, p1.number==p2.number))".
func TestInferencePoolCRD(t *testing.T) {
	v := inferencePoolValidator(t)
	var pool object
	for _, o := range render(t, "kubernetes/examples/gateway").objects {
		if o.kind() == "InferencePool" {
			pool = o
		}
	}
	if pool == nil {
		t.Fatal("the gateway example has no InferencePool")
	}
	ports := func(ns ...int) []any {
		out := []any{}
		for _, n := range ns {
			out = append(out, map[string]any{"number": float64(n)})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		value any // nil deletes
		path  []any
		want  string // "" = valid; else the start of an error's text
	}{
		{"as rendered", "vllm", []any{"metadata", "name"}, ""},
		{"FailClose", "FailClose", []any{"spec", "endpointPickerRef", "failureMode"}, ""},
		{"default kind", nil, []any{"spec", "endpointPickerRef", "kind"}, ""},
		{"default failureMode", nil, []any{"spec", "endpointPickerRef", "failureMode"}, ""},
		{"eight targetPorts", ports(8000, 8001, 8002, 8003, 8004, 8005, 8006, 8007), []any{"spec", "targetPorts"}, ""},
		{"h2c engines", "kubernetes.io/h2c", []any{"spec", "appProtocol"}, ""},
		{"missing selector", nil, []any{"spec", "selector"}, "spec.selector: Required value"},
		{"empty matchLabels", map[string]any{}, []any{"spec", "selector", "matchLabels"}, "spec.selector.matchLabels: Invalid value"},
		{"bad label value", "not a label!", []any{"spec", "selector", "matchLabels", "app.kubernetes.io/name"}, "spec.selector.matchLabels.app.kubernetes.io/name: Invalid value"},
		{"missing targetPorts", nil, []any{"spec", "targetPorts"}, "spec.targetPorts: Required value"},
		{"no targetPorts", ports(), []any{"spec", "targetPorts"}, "spec.targetPorts: Invalid value"},
		{"9 targetPorts", ports(8000, 8001, 8002, 8003, 8004, 8005, 8006, 8007, 8008), []any{"spec", "targetPorts"}, "spec.targetPorts: Too many"},
		{"duplicate targetPorts", ports(8000, 8000), []any{"spec", "targetPorts"}, "spec.targetPorts: Invalid value: port number must be unique"},
		{"targetPort 0", ports(0), []any{"spec", "targetPorts"}, "spec.targetPorts[0].number: Invalid value"},
		{"targetPort 65536", ports(65536), []any{"spec", "targetPorts"}, "spec.targetPorts[0].number: Invalid value"},
		{"bad failureMode", "FailSometimes", []any{"spec", "endpointPickerRef", "failureMode"}, "spec.endpointPickerRef.failureMode: Unsupported value"},
		{"wrong group", "inference.networking.x-k8s.io/v1", []any{"apiVersion"}, "apiVersion: Invalid value"},
		{"wrong version", inferencev1.GroupName + "/v1alpha2", []any{"apiVersion"}, "apiVersion: Invalid value"},
		{"wrong kind", "InferenceModel", []any{"kind"}, "kind: Invalid value"},
		{"wrong endpointPickerRef group", "Not_A_Group", []any{"spec", "endpointPickerRef", "group"}, "spec.endpointPickerRef.group: Invalid value"},
		{"default kind without port", map[string]any{"name": "prefixd-epp"}, []any{"spec", "endpointPickerRef"}, "spec.endpointPickerRef: Invalid value: port is required"},
		{"Service without port", nil, []any{"spec", "endpointPickerRef", "port"}, "spec.endpointPickerRef: Invalid value: port is required"},
		{"EPP port 0", map[string]any{"number": float64(0)}, []any{"spec", "endpointPickerRef", "port"}, "spec.endpointPickerRef.port.number: Invalid value"},
		{"missing EPP name", nil, []any{"spec", "endpointPickerRef", "name"}, "spec.endpointPickerRef.name: Required value"},
		{"bad appProtocol", "grpc", []any{"spec", "appProtocol"}, "spec.appProtocol: Unsupported value"},
		{"unknown field", "prefixd", []any{"spec", "endpointPickerRef", "namespace"}, "spec.endpointPickerRef.namespace: Forbidden: unknown field"},
		{"bad name", "vLLM_pool", []any{"metadata", "name"}, "metadata.name: Invalid value"},
		{"targetPorts not a list", "8000", []any{"spec", "targetPorts"}, "spec.targetPorts: Invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := clone(t, []object{pool})[0]
			set(p, tc.value, tc.path...)
			errs := v.validate(p)
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Errorf("refused: %v", errs)
			case tc.want != "" && !slices.ContainsFunc(errs, func(e *field.Error) bool { return strings.HasPrefix(e.Error(), tc.want) }):
				t.Errorf("errors %v: none starts with %q", errs, tc.want)
			}
		})
	}
}
