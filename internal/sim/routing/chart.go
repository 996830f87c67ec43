package routing

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Chart file names WriteCharts writes.
const (
	ChartTTFT    = "ttft-cdf.svg"
	ChartHitRate = "hit-rate-vs-load.svg"
	ChartP50     = "ttft-p50-vs-load.svg"
	ChartP99     = "ttft-p99-vs-load.svg"
	ChartThrough = "throughput-vs-load.svg"
	ChartWeights = "ttft-vs-overlap-weight.svg"
)

// palette is one colour per policy, in Policies order (the oracle is
// drawn black and dashed).
var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, // random: red
	{0xff, 0x7f, 0x0e, 0xff}, // round-robin: orange
	{0xbc, 0xbd, 0x22, 0xff}, // least-loaded: olive
	{0x8c, 0x56, 0x4b, 0xff}, // consistent-hash: brown
	{0x94, 0x67, 0xbd, 0xff}, // approx-prefix: purple
	{0x1f, 0x77, 0xb4, 0xff}, // prefixd: blue
	{0x17, 0xbe, 0xcf, 0xff}, // prefixd-predicted: cyan
	{0x00, 0x00, 0x00, 0xff}, // oracle: black
	{0x2c, 0xa0, 0x2c, 0xff}, // prefixd-disagg: green
	{0xe3, 0x77, 0xc2, 0xff}, // prefixd-queued: pink
	{0x7f, 0x7f, 0x7f, 0xff}, // prefixd-session: grey
}

// style gives each policy one colour and dash, the same in every chart;
// more than one replica dots the line, the more the finer.
func style(p Policy, replicas int) draw.LineStyle {
	i := slices.Index(Policies, p)
	ls := draw.LineStyle{Width: vg.Points(1.5), Color: palette[i%len(palette)]}
	switch p {
	case Oracle:
		ls.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	case Prefixd:
		ls.Width = vg.Points(2.5)
	}
	if replicas > 1 {
		on := max(8/float64(replicas), 1) * 4
		ls.Dashes = []vg.Length{vg.Points(on), vg.Points(2)}
	}
	return ls
}

// legendRoom widens the x axis so that the legend, top right, sits
// beside the data instead of over it.
func legendRoom(p *plot.Plot, log bool) {
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	if log {
		p.X.Max *= 8
	} else {
		p.X.Max += 0.45 * (p.X.Max - p.X.Min)
	}
}

// WriteCharts draws the report's charts into dir as SVG: the TTFT CDF of
// every policy at speedup cdfAt (the trace's own load: 1), and hit rate,
// p99 TTFT and throughput against offered load over the sweep. It returns
// the files written.
func (rep Report) WriteCharts(dir string, cdfAt float64) ([]string, error) {
	var files []string
	save := func(p *plot.Plot, name string) (err error) {
		// gonum/plot panics on data it cannot draw: report it instead.
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("chart %s: %v", name, r)
			}
		}()
		for _, ax := range []*plot.Axis{&p.X, &p.Y} {
			if _, log := ax.Scale.(plot.LogScale); log {
				padLog(ax)
			}
		}
		path := filepath.Join(dir, name)
		if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		files = append(files, path)
		return nil
	}
	if p := rep.cdf(cdfAt); p != nil {
		if err := save(p, ChartTTFT); err != nil {
			return files, err
		}
	}
	if p := rep.weightChart(); p != nil {
		if err := save(p, ChartWeights); err != nil {
			return files, err
		}
	}
	if len(speedupsOf(rep.Results)) < 2 {
		return files, nil
	}
	for _, c := range []struct {
		name, title, y string
		v              func(Result) float64
		logY           bool
	}{
		{ChartHitRate, "Prefix-cache hit rate against offered load", "hit rate (% of prompt tokens)", func(r Result) float64 { return 100 * r.HitRate }, false},
		{ChartP50, "Median TTFT against offered load", "p50 TTFT (s, log)", func(r Result) float64 { return r.TTFT.P50 / 1000 }, true},
		{ChartP99, "p99 TTFT against offered load", "p99 TTFT (s, log)", func(r Result) float64 { return r.TTFT.P99 / 1000 }, true},
		{ChartThrough, "Throughput against offered load", "completed requests/s", func(r Result) float64 { return r.ThroughputRPS }, false},
	} {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "offered load (requests/s)"
		p.Y.Label.Text = c.y
		if c.logY {
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		}
		for _, sr := range seriesOf(rep.Results) {
			var xys plotter.XYs
			for _, r := range rep.Results {
				if r.Policy == sr.Policy && r.Replicas == sr.Replicas {
					y := c.v(r)
					if c.logY && y <= 0 {
						continue
					}
					xys = append(xys, plotter.XY{X: r.OfferedRPS, Y: y})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return files, fmt.Errorf("chart %s: %w", c.name, err)
			}
			l.LineStyle = style(sr.Policy, sr.Replicas)
			pts.Color, pts.Shape = l.LineStyle.Color, draw.CircleGlyph{}
			p.Add(l, pts)
			p.Legend.Add(rep.name(Result{Policy: sr.Policy, Replicas: sr.Replicas}), l)
		}
		legendRoom(p, false)
		if err := save(p, c.name); err != nil {
			return files, err
		}
	}
	return files, nil
}

// cdf plots each policy's TTFT CDF at speedup sp (log time axis), or nil
// without such results.
func (rep Report) cdf(sp float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT CDF at ×%g of the trace's load", sp)
	p.X.Label.Text = "time to first token (s, log)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	any := false
	for _, r := range rep.Results {
		if r.Speedup != sp || len(r.TTFTs) == 0 {
			continue
		}
		any = true
		// At most 500 points per curve: quantiles of the sorted samples.
		n := min(len(r.TTFTs), 500)
		xys := make(plotter.XYs, 0, n)
		for i := range n {
			j := int(math.Round(float64(i) * float64(len(r.TTFTs)-1) / float64(max(n-1, 1))))
			x := max(r.TTFTs[j], 1) / 1000 // a log axis needs x > 0: floor at 1 ms
			xys = append(xys, plotter.XY{X: x, Y: float64(j+1) / float64(len(r.TTFTs))})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue
		}
		l.LineStyle = style(r.Policy, r.Replicas)
		p.Add(l)
		p.Legend.Add(rep.name(r), l)
	}
	if !any {
		return nil
	}
	legendRoom(p, true)
	return p
}

// weightChart plots prefixd's TTFT p50 against the overlap weight, one
// line per load level, the oracle's dashed; nil without weight runs.
func (rep Report) weightChart() *plot.Plot {
	if len(rep.Weights) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "TTFT p50 against the overlap weight, per load"
	p.X.Label.Text = "overlap weight (credit per cached block)"
	p.Y.Label.Text = "TTFT p50 (s, log)"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	for i, sp := range speedupsOf(rep.Weights) {
		for _, pol := range []Policy{Prefixd, Oracle} {
			var xys plotter.XYs
			for _, r := range rep.Weights {
				if r.Policy == pol && r.Speedup == sp && r.TTFT.P50 > 0 {
					xys = append(xys, plotter.XY{X: r.Weight, Y: r.TTFT.P50 / 1000})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				continue
			}
			l.LineStyle = draw.LineStyle{Width: vg.Points(1.5), Color: palette[(2*i)%len(palette)]}
			if pol == Oracle {
				l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			pts.Color = l.LineStyle.Color
			p.Add(l, pts)
			p.Legend.Add(fmt.Sprintf("%s ×%g", pol, sp), l)
		}
	}
	legendRoom(p, false)
	return p
}

// padLog widens a log axis whose data collapse to one value (a single
// run), which a log scale cannot draw.
func padLog(ax *plot.Axis) {
	if ax.Max <= 0 {
		ax.Min, ax.Max = 0.001, 1
		return
	}
	if ax.Min <= 0 {
		ax.Min = ax.Max / 1000
	}
	if ax.Max < ax.Min*1.01 {
		ax.Min, ax.Max = ax.Min/2, ax.Max*2
	}
}
