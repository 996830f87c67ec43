package apiserver

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

// procStatus returns a field of /proc/self/status in bytes (0 if absent).
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapSampler records the largest heap (bytes in heap objects, live or
// not yet swept) seen between start and stop.
type heapSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

func startHeapSampler() *heapSampler {
	s := &heapSampler{done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	s.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			s.peak = max(s.peak, sample[0].Value.Uint64())
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	})
	return s
}

func (s *heapSampler) stop() uint64 {
	close(s.done)
	s.wg.Wait()
	return s.peak
}

// BenchmarkDumpConcurrent serves four concurrent GET /dump of the
// benchmark index (indexer/workload.DefaultConfig: 1,048,576 entries in
// one partition) over a real loopback HTTP server, the clients reading
// and discarding the bodies, and reports the memory it took: the heap's
// peak above the idle heap (sampled every millisecond) and the process's
// peak RSS (VmHWM, reset before the dumps) above the idle RSS. Run it on
// its own, once:
//
//	go test -run '^$' -bench DumpConcurrent -benchtime 1x ./internal/apiserver/
func BenchmarkDumpConcurrent(b *testing.B) {
	ix := func() *indexer.Index {
		w, err := workload.Generate(workload.DefaultConfig())
		if err != nil {
			b.Fatal(err)
		}
		ix := indexer.New(indexer.Options{})
		if err := ix.AddPartition(mDefault, w.BlockSize); err != nil {
			b.Fatal(err)
		}
		for i, e := range w.Events {
			if _, err := ix.Apply(mDefault, e.Rank, uint64(i), []indexer.Op{e.Op}); err != nil {
				b.Fatal(err)
			}
		}
		return ix
	}()
	srv := httptest.NewServer(NewHandler(Config{Index: ix, MaxConcurrentDumps: 4}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	const clients = 4
	var heapMB, rssMB, sizeMB, secs float64
	var idleHeap, idleRSS int64
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		idleHeap, idleRSS = int64(ms.HeapAlloc), procStatus("VmRSS")
		resetHWM := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
		b.StartTimer()
		s := startHeapSampler()
		t0 := time.Now()
		var wg sync.WaitGroup
		sizes := make([]int64, clients)
		errs := make([]error, clients)
		for c := range clients {
			wg.Go(func() {
				resp, err := client.Get(srv.URL + "/dump")
				if err != nil {
					errs[c] = err
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[c] = fmt.Errorf("HTTP %d", resp.StatusCode)
					return
				}
				sizes[c], errs[c] = io.Copy(io.Discard, resp.Body)
			})
		}
		wg.Wait()
		secs = time.Since(t0).Seconds()
		peak := s.stop()
		for c := range clients {
			if errs[c] != nil {
				b.Fatalf("dump %d: %v", c, errs[c])
			}
			if sizes[c] != sizes[0] {
				b.Fatalf("dumps of %d and %d bytes", sizes[0], sizes[c])
			}
		}
		heapMB = float64(int64(peak)-idleHeap) / (1 << 20)
		if resetHWM {
			rssMB = float64(procStatus("VmHWM")-idleRSS) / (1 << 20)
		}
		sizeMB = float64(sizes[0]) / (1 << 20)
	}
	b.ReportMetric(float64(idleHeap)/(1<<20), "idle-heap-MiB")
	b.ReportMetric(float64(idleRSS)/(1<<20), "idle-rss-MiB")
	b.ReportMetric(heapMB, "peak-heap-MiB")
	b.ReportMetric(rssMB, "peak-rss-MiB")
	b.ReportMetric(sizeMB, "dump-MiB")
	b.ReportMetric(secs, "s/4dumps")
}
