package indexbench

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Files WriteReport writes into its directory.
const (
	ReportJSON      = "report.json"
	ReportText      = "report.md"
	ChartThroughput = "achieved-vs-offered.svg"
	ChartLatency    = "score-latency.svg"
)

// palette is one colour per core count, in the order run.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x8c, 0x56, 0x4b, 0xff}, // brown
}

// WriteReport writes what Run printed (text), the reports as JSON, and
// two SVG charts into dir: achieved against offered ops/s at each core
// count, and score latency at idle and under ingest. It returns the
// files written.
func WriteReport(dir string, reports []Report, text string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	write := func(name string, f func(io.Writer) error) error {
		path := filepath.Join(dir, name)
		out, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := f(out); err != nil {
			out.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := out.Close(); err != nil {
			return err
		}
		files = append(files, path)
		return nil
	}
	if err := write(ReportText, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "# `prefixd-bench index`\n\n```\n%s```\n", text)
		return err
	}); err != nil {
		return files, err
	}
	if err := write(ReportJSON, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(reports)
	}); err != nil {
		return files, err
	}
	for _, c := range []struct {
		name string
		plot func([]Report) (*plot.Plot, error)
	}{{ChartThroughput, throughputChart}, {ChartLatency, latencyChart}} {
		p, err := c.plot(reports)
		if err != nil {
			return files, fmt.Errorf("chart %s: %w", c.name, err)
		}
		path := filepath.Join(dir, c.name)
		if err := save(p, path); err != nil {
			return files, fmt.Errorf("chart %s: %w", c.name, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// save draws p into path; gonum/plot panics on data it cannot draw,
// which is returned instead.
func save(p *plot.Plot, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// throughputChart plots achieved against offered ops/s (millions) for
// each core count, with the line achieved = offered.
func throughputChart(reports []Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Mooncake trace into the index: achieved against offered"
	p.X.Label.Text = "offered (M ops/s)"
	p.Y.Label.Text = "achieved (M ops/s)"
	p.Legend.Top, p.Legend.Left = true, true
	var top float64
	for i, rp := range reports {
		var xys plotter.XYs
		for _, r := range rp.Points {
			xys = append(xys, plotter.XY{X: r.Offered / 1e6, Y: r.Achieved / 1e6})
			top = max(top, r.Offered/1e6)
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.LineStyle = draw.LineStyle{Width: vg.Points(2), Color: palette[i%len(palette)]}
		pts.Color, pts.Shape = l.LineStyle.Color, draw.CircleGlyph{}
		p.Add(l, pts)
		p.Legend.Add(fmt.Sprintf("GOMAXPROCS=%d, %d appliers, %s (unpaced %.2fM)", rp.CPUs, rp.Appliers, rp.Shape, rp.Capacity.Achieved/1e6), l)
	}
	if top > 0 {
		ref, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: top, Y: top}})
		if err != nil {
			return nil, err
		}
		ref.LineStyle = draw.LineStyle{Width: vg.Points(1), Color: color.Gray{Y: 0x80}, Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}
		p.Add(ref)
		p.Legend.Add("achieved = offered", ref)
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// latencyChart plots score latency p50 and p99 at idle and under
// saturating ingest against the core count, on a log scale, from the
// reports that measured it (one per core count).
func latencyChart(all []Report) (*plot.Plot, error) {
	var reports []Report
	for _, rp := range all {
		if rp.Latency.LoadN > 0 {
			reports = append(reports, rp)
		}
	}
	p := plot.New()
	p.Title.Text = "Score latency (8,192-token prompt, hash + match)"
	p.Y.Label.Text = "µs (log)"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	series := []struct {
		name   string
		v      func(LatencyResult) time.Duration
		dashed bool
	}{
		{"idle p50", func(l LatencyResult) time.Duration { return l.IdleP50 }, true},
		{"idle p99", func(l LatencyResult) time.Duration { return l.IdleP99 }, true},
		{"under ingest p50", func(l LatencyResult) time.Duration { return l.LoadP50 }, false},
		{"under ingest p99", func(l LatencyResult) time.Duration { return l.LoadP99 }, false},
		{"ingest elsewhere p50", func(l LatencyResult) time.Duration { return l.OtherP50 }, true},
		{"ingest elsewhere p99", func(l LatencyResult) time.Duration { return l.OtherP99 }, true},
	}
	names := make([]string, len(reports))
	lo, hi := 1e18, 0.0
	for i, rp := range reports {
		names[i] = fmt.Sprintf("GOMAXPROCS=%d", rp.CPUs)
	}
	for j, s := range series {
		var xys plotter.XYs
		for i, rp := range reports {
			if us := float64(s.v(rp.Latency).Nanoseconds()) / 1e3; us > 0 {
				xys = append(xys, plotter.XY{X: float64(i), Y: us})
				lo, hi = min(lo, us), max(hi, us)
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.LineStyle = draw.LineStyle{Width: vg.Points(2), Color: palette[j/2*2%len(palette)]}
		if j%2 == 1 {
			l.LineStyle.Color = palette[(j/2*2+1)%len(palette)]
		}
		if s.dashed {
			l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		pts.Color, pts.Shape = l.LineStyle.Color, draw.CircleGlyph{}
		p.Add(l, pts)
		p.Legend.Add(s.name, l)
	}
	if hi > 0 {
		p.Y.Min, p.Y.Max = lo/2, hi*8 // room for the legend above the data
	}
	p.X.Min, p.X.Max = -0.5, float64(len(reports))-0.5
	p.Legend.Top, p.Legend.Left = true, true
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return p, nil
}
