package engineload

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"

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

// maxLine bounds one line of a /metrics body; real lines are well
// under a kilobyte.
const maxLine = 64 << 10

// errors of reading and parsing, each a failure reason.
var (
	errTooLarge           = errors.New("body too large")
	errParse              = errors.New("not the Prometheus text format")
	errTooMany            = errors.New("too many lines of the load gauges")
	errBadValue           = errors.New("value out of range")
	errBadLabel           = errors.New("rank label not a dp rank")
	errMissing            = errors.New("gauges missing")
	errUnlabeled          = errors.New("series carry no rank label, and the engine has several ranks")
	errUnknownRank        = errors.New("series name a rank the engine did not register")
	reasonOf              = map[error]string{errTooLarge: "too_large", errParse: "parse", errTooMany: "too_many_series", errBadValue: "bad_value", errBadLabel: "bad_label", errMissing: "missing", errUnlabeled: "unlabeled", errUnknownRank: "unknown_rank"}
	noLabel        uint64 = math.MaxUint64 // the rank key of a series without a rank label
)

// filter reads a /metrics body from r as it arrives, at most maxBytes of
// it, and keeps only the sample, HELP and TYPE lines of the wanted
// families (the rest of an engine's /metrics, histograms mostly, is most
// of its size), at most maxLines of them: what it holds is the kept
// lines and one line's buffer, whatever the body. A line over maxLine is
// errParse; an error of r is returned as it is.
func filter(r io.Reader, maxBytes int64, maxLines int) ([]byte, error) {
	br := readers.Get().(*bufio.Reader)
	br.Reset(io.LimitReader(r, maxBytes+1))
	defer func() { br.Reset(nil); readers.Put(br) }()
	var out []byte
	var read int64
	lines := 0
	for {
		line, err := br.ReadSlice('\n')
		if read += int64(len(line)); read > maxBytes {
			return nil, fmt.Errorf("over %d bytes: %w", maxBytes, errTooLarge)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return nil, fmt.Errorf("a line over %d bytes: %w", maxLine, errParse)
		case err != nil && !errors.Is(err, io.EOF):
			return nil, err
		}
		if keep(line) {
			if lines++; lines > maxLines {
				return nil, fmt.Errorf("over %d: %w", maxLines, errTooMany)
			}
			out = append(out, line...)
			if line[len(line)-1] != '\n' {
				out = append(out, '\n')
			}
		}
		if err != nil { // io.EOF
			return out, nil
		}
	}
}

// readers are filter's line buffers, maxLine each.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, maxLine) }}

// keep reports whether line is a sample, HELP or TYPE line of a wanted
// family.
func keep(line []byte) bool {
	rest := line
	if r, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
		rest = r
	} else if r, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
		rest = r
	}
	for _, name := range wanted {
		if r, ok := bytes.CutPrefix(rest, name); ok && len(r) > 0 && (r[0] == '{' || r[0] == ' ' || r[0] == '\t') {
			return true
		}
	}
	return false
}

// figure is what a body says of one rank, before the time is stamped.
type figure struct {
	running, waiting, usage float64
	has                     [3]bool
}

// parse reads the figures of ranks from a /metrics body, within the
// bounds of filter (parseKept).
func parse(body []byte, ranks []uint32, maxLines int) (figures map[uint32]coordinator.EngineLoad, errs map[uint32]error, problems []error, fatal error) {
	kept, err := filter(bytes.NewReader(body), int64(len(body)), maxLines)
	if err != nil {
		return nil, nil, nil, err
	}
	return parseKept(kept, ranks)
}

// parseKept reads the figures of ranks from the lines filter kept. A rank
// with several series (one per tp or pp rank) takes the largest of each
// gauge. fatal fails the whole body; otherwise every rank has a figure or
// an error in errs, and problems are the body's faults that cost no
// registered rank its figure (a series of an unknown rank, a malformed
// rank label).
func parseKept(kept []byte, ranks []uint32) (figures map[uint32]coordinator.EngineLoad, errs map[uint32]error, problems []error, fatal error) {
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
