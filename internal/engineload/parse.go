package engineload

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/prefixd/prefixd/coordinator"
)

// The gauges read, by engine. vLLM labels each series with engine (the
// dp rank, vllm/v1/metrics/loggers.py); SGLang with dp_rank when it runs
// data-parallel attention (python/sglang/srt/managers/scheduler.py).
const (
	vllmRunning = "vllm:num_requests_running"
	vllmWaiting = "vllm:num_requests_waiting"
	vllmUsage   = "vllm:kv_cache_usage_perc"
	sglRunning  = "sglang:num_running_reqs"
	sglWaiting  = "sglang:num_queue_reqs"
	sglUsage    = "sglang:token_usage"
)

// flavor is one engine's three gauge names and its rank label.
type flavor struct{ running, waiting, usage, rankLabel string }

var flavors = []flavor{
	{vllmRunning, vllmWaiting, vllmUsage, "engine"},
	{sglRunning, sglWaiting, sglUsage, "dp_rank"},
}

// wanted are the families kept from a body, every other line dropped
// before parsing.
var wanted = [][]byte{
	[]byte(vllmRunning), []byte(vllmWaiting), []byte(vllmUsage),
	[]byte(sglRunning), []byte(sglWaiting), []byte(sglUsage),
}

// errors of parsing, each a failure reason.
var (
	errParse              = errors.New("not the Prometheus text format")
	errTooMany            = errors.New("too many series")
	errBadValue           = errors.New("value out of range")
	errBadLabel           = errors.New("rank label not a dp rank")
	errMissing            = errors.New("gauges missing")
	errUnlabeled          = errors.New("series carry no rank label, and the engine has several ranks")
	errUnknownRank        = errors.New("series name a rank the engine did not register")
	reasonOf              = map[error]string{errParse: "parse", errTooMany: "too_many_series", errBadValue: "bad_value", errBadLabel: "bad_label", errMissing: "missing", errUnlabeled: "unlabeled", errUnknownRank: "unknown_rank"}
	noLabel        uint64 = math.MaxUint64 // the rank key of a series without a rank label
)

// filter keeps the sample, HELP and TYPE lines of the wanted families
// (the rest of an engine's /metrics, histograms mostly, is most of its
// size) and counts the samples kept.
func filter(body []byte) (kept []byte, samples int) {
	out := make([]byte, 0, 1024)
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i+1], body[i+1:]
		} else {
			body = nil
		}
		rest, comment := line, false
		if r, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
			rest, comment = r, true
		} else if r, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
			rest, comment = r, true
		}
		for _, name := range wanted {
			if r, ok := bytes.CutPrefix(rest, name); ok && len(r) > 0 && (r[0] == '{' || r[0] == ' ' || r[0] == '\t') {
				out = append(out, line...)
				if line[len(line)-1] != '\n' {
					out = append(out, '\n')
				}
				if !comment {
					samples++
				}
				break
			}
		}
	}
	return out, samples
}

// figure is what a body says of one rank, before the time is stamped.
type figure struct {
	running, waiting, usage float64
	has                     [3]bool
}

// parse reads the figures of ranks from a /metrics body: at most
// maxSeries samples of the wanted gauges. A rank with several series
// (one per tp or pp rank) takes the largest of each gauge. fatal fails
// the whole body; otherwise every rank has a figure or an error in
// errs, and problems are the body's faults that cost no registered rank
// its figure (a series of an unknown rank, a malformed rank label).
func parse(body []byte, ranks []uint32, maxSeries int) (figures map[uint32]coordinator.EngineLoad, errs map[uint32]error, problems []error, fatal error) {
	kept, n := filter(body)
	if n > maxSeries {
		return nil, nil, nil, fmt.Errorf("%d samples of the load gauges, at most %d: %w", n, maxSeries, errTooMany)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, perr := parser.TextToMetricFamilies(bytes.NewReader(kept))
	if perr != nil {
		return nil, nil, nil, errParse
	}
	var f flavor
	for _, fl := range flavors {
		if fams[fl.running] != nil || fams[fl.waiting] != nil || fams[fl.usage] != nil {
			f = fl
			break
		}
	}
	figures, errs = map[uint32]coordinator.EngineLoad{}, map[uint32]error{}
	if f.running == "" {
		for _, r := range ranks {
			errs[r] = errMissing
		}
		return figures, errs, nil, nil
	}
	byKey := map[uint64]*figure{}
	for i, name := range []string{f.running, f.waiting, f.usage} {
		fam := fams[name]
		if fam == nil {
			continue
		}
		for _, m := range fam.GetMetric() {
			key, ok := noLabel, true
			for _, lp := range m.GetLabel() {
				if lp.GetName() == f.rankLabel {
					r, err := strconv.ParseUint(lp.GetValue(), 10, 32)
					if err != nil {
						ok = false
						break
					}
					key = r
				}
			}
			if !ok {
				problems = append(problems, errBadLabel)
				continue
			}
			v, ok := value(m)
			if !ok {
				continue
			}
			fig := byKey[key]
			if fig == nil {
				fig = &figure{}
				byKey[key] = fig
			}
			p := [...]*float64{&fig.running, &fig.waiting, &fig.usage}[i]
			switch {
			case math.IsNaN(v) || math.IsNaN(*p):
				*p = math.NaN() // refused below, whatever else the rank says
			case !fig.has[i] || v > *p:
				*p = v
			}
			fig.has[i] = true
		}
	}
	// One registered rank takes the body's one rank, whatever its label
	// (an engine started as one rank of a larger deployment).
	if len(ranks) == 1 && len(byKey) == 1 {
		for k, fig := range byKey {
			delete(byKey, k)
			byKey[uint64(ranks[0])] = fig
		}
	}
	for k, fig := range byKey {
		switch {
		case k == noLabel:
			problems = append(problems, errUnlabeled)
			continue
		case !contains(ranks, uint32(k)):
			problems = append(problems, errUnknownRank)
			continue
		}
		r := uint32(k)
		if fig.has != [3]bool{true, true, true} {
			errs[r] = errMissing
			continue
		}
		l, ok := load(fig)
		if !ok {
			errs[r] = errBadValue
			continue
		}
		figures[r] = l
	}
	for _, r := range ranks {
		if _, ok := figures[r]; !ok && errs[r] == nil {
			errs[r] = errMissing
		}
	}
	return figures, errs, problems, nil
}

func contains(rs []uint32, r uint32) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// value is a gauge's (or an untyped sample's) value.
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// load turns a figure into an EngineLoad, refusing what no engine
// reports: counts negative, not finite or beyond
// coordinator.MaxEngineRequests, a usage outside [0, 1].
func load(f *figure) (coordinator.EngineLoad, bool) {
	count := func(v float64) (int, bool) {
		if math.IsNaN(v) || v < 0 || v > coordinator.MaxEngineRequests {
			return 0, false
		}
		return int(math.Round(v)), true
	}
	run, ok1 := count(f.running)
	wait, ok2 := count(f.waiting)
	if !ok1 || !ok2 || math.IsNaN(f.usage) || f.usage < 0 || f.usage > 1 {
		return coordinator.EngineLoad{}, false
	}
	return coordinator.EngineLoad{Running: run, Waiting: wait, KVUsage: f.usage}, true
}
