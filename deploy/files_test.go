package deploy

import (
	"bufio"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.etcd.io/etcd/server/v3/embed"
	"sigs.k8s.io/yaml"
)

const (
	rulesFile     = "prometheus/prefixd-alerts.yaml"
	dashboardFile = "grafana/prefixd.json"
)

// goModVersion returns the version go.mod requires of module path, or its
// go directive for path "go".
func goModVersion(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == path {
			return f[1]
		}
	}
	t.Fatalf("go.mod: no %s", path)
	return ""
}

// TestEtcdConfig: every ETCD_* variable of the StatefulSet is a flag of
// the etcd release the manifests run, and that release is the one prefixd
// is built and tested against.
func TestEtcdConfig(t *testing.T) {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	embed.NewConfig().AddFlags(fs)
	for _, f := range []string{"initial-cluster-state", "config-file", "discovery-fallback"} { // etcdmain's own
		fs.String(f, "", "")
	}
	r := render(t, "kubernetes/base")
	ss, _ := r.workload("StatefulSet", "etcd")
	c := ss.pod.Containers[0]
	if want := "quay.io/coreos/etcd:" + goModVersion(t, "go.etcd.io/etcd/server/v3"); c.Image != want {
		t.Errorf("etcd image %s, want %s (go.mod's etcd)", c.Image, want)
	}
	n := 0
	for _, e := range c.Env {
		name, ok := strings.CutPrefix(e.Name, "ETCD_")
		if !ok {
			continue
		}
		n++
		if fs.Lookup(strings.ReplaceAll(strings.ToLower(name), "_", "-")) == nil {
			t.Errorf("%s is no etcd flag", e.Name)
		}
	}
	if n < 8 {
		t.Errorf("only %d ETCD_* variables", n)
	}
}

// TestPrometheusRuleMatchesRulesFile: the PrometheusRule in the base
// carries exactly the rules of prometheus/.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups any `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	var cr any
	render(t, "kubernetes/base").find("PrometheusRule", "prefixd").decode(t, &cr, "spec", "groups")
	if !reflect.DeepEqual(file.Groups, cr) {
		t.Errorf("PrometheusRule prefixd's groups differ from %s", rulesFile)
	}
}

// selector is one vector selector of a query, and where it was found.
type selector struct {
	where    string
	matchers []*labels.Matcher
}

func (s selector) name() string {
	for _, m := range s.matchers {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

var promql = parser.NewParser(parser.Options{})

func selectorsOf(t *testing.T, where, expr string) []selector {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q: %v", where, expr, err)
		return nil
	}
	var out []selector
	for _, ms := range parser.ExtractSelectors(e) {
		s := selector{where: where, matchers: ms}
		if s.name() == "" {
			t.Errorf("%s: %q: a selector without a metric name", where, expr)
		}
		out = append(out, s)
	}
	return out
}

// ruleSelectors parses the alert rules strictly (as Prometheus loads them)
// and returns the selectors of their expressions.
func ruleSelectors(t *testing.T) []selector {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if groups == nil {
		t.FailNow()
	}
	var out []selector
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: rule %q: want an alert with a severity label and a summary", rulesFile, r.Alert+r.Record)
			}
			out = append(out, selectorsOf(t, rulesFile+": "+r.Alert, r.Expr)...)
		}
	}
	return out
}

// grafanaMacros are replaced before parsing a dashboard query.
var grafanaMacros = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_]+\)$`)

// dashboardSelectors parses the dashboard and returns the selectors of
// every panel's queries and of its template variables.
func dashboardSelectors(t *testing.T) []selector {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		UID        string            `json:"uid"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []selector
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: %v", dashboardFile, err)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no queries", dashboardFile, p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, selectorsOf(t, dashboardFile+": "+p.Title, grafanaMacros.Replace(tg.Expr))...)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		m := labelValues.FindStringSubmatch(q["query"].(string))
		if m == nil {
			t.Errorf("%s: variable %s: query %v is not label_values(selector, label)", dashboardFile, v.Name, q["query"])
			continue
		}
		out = append(out, selectorsOf(t, dashboardFile+": variable "+v.Name, m[1])...)
	}
	return out
}

// TestQueriesParse: the alert rules load, and every dashboard query parses.
func TestQueriesParse(t *testing.T) {
	for name, sels := range map[string][]selector{"rules": ruleSelectors(t), "dashboard": dashboardSelectors(t)} {
		if len(sels) < 10 {
			t.Errorf("%s: only %d selectors", name, len(sels))
		}
	}
}

// TestDockerfile: the image is built with go.mod's Go, statically, holds
// ./cmd/prefixd alone (not the benchmark lab, ./cmd/prefixd-bench), and
// runs prefixd as a non-root user; and ./cmd/prefixd builds without cgo.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	var froms, builds []string
	user, entry, cmd := "", "", ""
	for _, line := range strings.Split(df, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] != "#" {
			for _, w := range f {
				if strings.HasPrefix(w, "./cmd/") {
					builds = append(builds, w) // a command the image builds
				}
			}
		}
		switch f := strings.Fields(line); {
		case len(f) >= 2 && f[0] == "FROM":
			froms = append(froms, f[1])
			user = "" // per stage
		case len(f) >= 2 && f[0] == "USER":
			user = f[1]
		case len(f) >= 2 && f[0] == "ENTRYPOINT":
			entry = strings.Join(f[1:], " ")
		case len(f) >= 2 && f[0] == "CMD":
			cmd = strings.Join(f[1:], " ")
		}
	}
	goVersion := goModVersion(t, "go")
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:"+goVersion+"-") || !strings.HasPrefix(froms[1], "gcr.io/distroless/static") {
		t.Errorf("stages %v: want golang:%s-… then distroless static", froms, goVersion)
	}
	if user != "65532:65532" {
		t.Errorf("final stage runs as %q, want 65532:65532", user)
	}
	for _, want := range []string{"CGO_ENABLED=0 go build", "./cmd/prefixd", "-t " + prefixdImage + ":"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if len(builds) != 1 || builds[0] != "./cmd/prefixd" {
		t.Errorf("the image builds %q, want ./cmd/prefixd alone", builds)
	}
	if entry != `["/usr/local/bin/prefixd"]` {
		t.Errorf("ENTRYPOINT %s", entry)
	}
	var args []string
	if err := json.Unmarshal([]byte(cmd), &args); err != nil {
		t.Fatalf("CMD %s: %v", cmd, err)
	}
	checkInvocation(t, "Dockerfile CMD", args, nil)

	list := exec.Command("go", "list", "-e", "-deps", "-f", "{{with .Error}}{{.}}{{end}}{{range .DepsErrors}}{{.}}{{end}}", "./cmd/prefixd")
	list.Dir = ".."
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("CGO_ENABLED=0 go list -deps ./cmd/prefixd: %v\n%s", err, out)
	}
}

// TestSystemdUnit: the unit starts `prefixd serve` with real flags, its
// environment file names real flags, and the sandbox is in place.
func TestSystemdUnit(t *testing.T) {
	unit := map[string][]string{}
	f, err := os.Open("systemd/prefixd.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("prefixd.service: %q is not key=value", line)
			}
			unit[section+"."+k] = append(unit[section+"."+k], v)
		}
	}
	exec := strings.Fields(strings.Join(unit["Service.ExecStart"], ""))
	if len(exec) < 2 || exec[0] != "/usr/local/bin/prefixd" || exec[1] != "serve" {
		t.Fatalf("ExecStart %v: want /usr/local/bin/prefixd serve …", exec)
	}
	env, err := os.ReadFile("systemd/prefixd.env.example")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(env), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			names = append(names, k)
		}
	}
	_, values := checkInvocation(t, "prefixd.service", exec[1:], names)
	if len(names) < 5 || values["api-token"] == "" || values["listen"] == "" {
		t.Errorf("prefixd.env.example sets %v: want at least the listen address, the API token and etcd", names)
	}
	for k, want := range map[string]string{
		"Service.User": "prefixd", "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
		"Service.ProtectHome": "yes", "Service.PrivateTmp": "yes", "Service.PrivateDevices": "yes",
		"Service.CapabilityBoundingSet": "", "Service.RestrictNamespaces": "yes", "Service.MemoryDenyWriteExecute": "yes",
		"Service.SystemCallArchitectures": "native", "Service.StateDirectory": "prefixd", "Service.ProtectKernelTunables": "yes",
		"Service.EnvironmentFile": "/etc/prefixd/prefixd.env", "Install.WantedBy": "multi-user.target",
	} {
		if got := unit[k]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if !strings.Contains(strings.Join(exec, " "), "--data-dir=/var/lib/"+unit["Service.StateDirectory"][0]) {
		t.Errorf("ExecStart %v: the embedded etcd's --data-dir is not the StateDirectory", exec)
	}
	if fams := strings.Fields(strings.Join(unit["Service.RestrictAddressFamilies"], " ")); len(fams) == 0 || fams[0] == "~" {
		t.Errorf("RestrictAddressFamilies %v: want an allow list", fams)
	}
}
