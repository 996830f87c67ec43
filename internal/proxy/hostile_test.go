package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// The attacks of a client without credentials on the proxy's front door,
// over raw TCP where net/http's client would not send what they send.

// rawPost opens a connection to the proxy and sends the headers of a POST
// to path claiming a body of length bytes, then the first bytes of it.
func (s *stack) rawPost(path string, length int, first string) net.Conn {
	s.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, length, first)
	return c
}

// answer reads the response on c and whether the proxy closed the
// connection after it. The deadline only keeps a broken proxy from
// hanging the test.
func answer(t *testing.T, c net.Conn) (status int, body string, closed bool) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	return resp.StatusCode, string(b), errors.Is(err, io.EOF)
}

// heap returns the bytes of live heap after a collection.
func heap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

const mib = 1 << 20

// TestSilentBodies: 40 connections each claim a 32 MiB body (the largest
// the proxy takes) and send 10 bytes of it, then nothing — the attack
// that locked every client out, the budget being charged by the claimed
// length. Now a body costs what arrived: the heap grows by far less than
// the 1.25 GiB claimed, a normal request is answered while they are held,
// each is cut off with a 408 at the read timeout, and the budget is whole
// again after.
func TestSilentBodies(t *testing.T) {
	const (
		conns   = 40
		claimed = 32 << 20
		timeout = 5 * time.Second
	)
	s := startStack(t, proxy.Config{ReadTimeout: timeout}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	before := heap()
	slow := make([]net.Conn, conns)
	for i := range slow {
		slow[i] = s.rawPost("/v1/completions", claimed, `{"model":"`) // 10 bytes
	}
	testsupport.Eventually(t, time.Minute, "every slow body read as far as it came", func() bool { return s.proxy.BodyBytes() == conns*4096 })
	growth := heap() - before
	t.Logf("heap grew by %.2f MiB with %d bodies of %d MiB claimed in flight (%d MiB claimed in all)", float64(growth)/mib, conns, claimed/mib, conns*claimed/mib)
	if growth > 16*mib {
		t.Errorf("heap grew by %.1f MiB for %d silent bodies", float64(growth)/mib, conns)
	}

	// A normal request is answered while the slow ones are held.
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2}); code != 200 {
		t.Fatalf("a normal request during the attack: %d %s", code, body)
	}
	if held := s.proxy.BodyBytes(); held != conns*4096 {
		t.Fatalf("the slow bodies hold %d bytes after the normal request, want %d: some were cut before it was answered (the machine is too slow for the %v timeout)", held, conns*4096, timeout)
	}

	// Each slow body is cut off at the read timeout, its connection closed.
	for _, c := range slow {
		code, body, closed := answer(t, c)
		if code != 408 || !strings.Contains(body, `"message":"body: not received in time (10 bytes arrived)"`) || !closed {
			t.Fatalf("slow body: %d %s (closed %v)", code, body, closed)
		}
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return s.proxy.BodyBytes() == 0 })
	if _, page := s.get("/metrics"); !strings.Contains(page, fmt.Sprintf(`prefixd_proxy_bodies_refused_total{reason="timeout"} %d`, conns)) ||
		!strings.Contains(page, "prefixd_proxy_body_bytes 0") {
		t.Fatalf("metrics lack the refused bodies:\n%s", page)
	}
}

// TestStalledBodiesLeaveTheReserve: bodies that send much and then stall
// hold at most the budget less its reserve; a body that stalls in the
// reserve is cut off after BodyHold (long before the read timeout), so a
// request refused while the reserve was taken gets in when it retries.
func TestStalledBodiesLeaveTheReserve(t *testing.T) {
	s := startStack(t, proxy.Config{MaxBodyBytes: 4 * mib, BodyBudget: 8 * mib, BodyReserve: 2 * mib, BodyHold: 500 * time.Millisecond, ReadTimeout: time.Minute},
		coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	// A1 and A2 send 2.1 MB of 3 MB and stall: 3,000,001 bytes held each,
	// below the reserve's line (6 MiB).
	var a []net.Conn
	for i := range 2 {
		a = append(a, s.rawPost("/v1/completions", 3_000_000, strings.Repeat(" ", 2_100_000)))
		want := int64(i+1) * 3_000_001
		testsupport.Eventually(t, time.Minute, "A's bytes read", func() bool { return s.proxy.BodyBytes() == want })
	}
	// B sends 1.1 MB of 2 MB and stalls, in the reserve.
	b := s.rawPost("/v1/completions", 2_000_000, strings.Repeat(" ", 1_100_000))
	start := time.Now()
	testsupport.Eventually(t, time.Minute, "B's bytes read", func() bool { return s.proxy.BodyBytes() == 2*3_000_001+2_000_001 })
	// C, a normal request of 500 kB, does not fit beside them.
	c := map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2, "user": strings.Repeat("u", 500_000)}
	if code, body := s.post("/v1/completions", c); code != 503 || !strings.Contains(body, "retry later") {
		t.Fatalf("C beside A and B: %d %s", code, body)
	}
	s.logs.Wait(t, 5*time.Second, "proxy: request bodies refused: the body budget is full", "budget_bytes=8388608")
	// B is cut off BodyHold after its last growth.
	code, body, closed := answer(t, b)
	if code != 408 || !strings.Contains(body, "stopped arriving for 500ms (1100000 bytes arrived)") || !closed {
		t.Fatalf("B: %d %s (closed %v)", code, body, closed)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("B cut off after %v", took)
	}
	// C retried gets in beside A1 and A2, which still hold their bytes.
	if code, body := s.post("/v1/completions", c); code != 200 {
		t.Fatalf("C after B: %d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "C's and B's bytes given back", func() bool { return s.proxy.BodyBytes() == 2*3_000_001 })
	for _, c := range a {
		c.Close()
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return s.proxy.BodyBytes() == 0 })
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_bodies_refused_total{reason="stalled"} 1`) ||
		!strings.Contains(page, `prefixd_proxy_bodies_refused_total{reason="budget"} 1`) {
		t.Fatalf("metrics lack the refused bodies:\n%s", page)
	}
}

// peakHeap samples the live heap until stop is called, which returns the
// highest HeapAlloc seen.
func peakHeap() (stop func() int64) {
	done, out := make(chan struct{}), make(chan int64)
	go func() {
		var peak int64
		var m runtime.MemStats
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, int64(m.HeapAlloc))
			select {
			case <-done:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(done); return <-out }
}

// TestTokenIDPromptBounded: a 32 MB body of 16.7 million token ids is
// refused with a 413 while its ids are read, past the millionth, not
// after decoding all of them (one such request took the heap to about
// 540 MB, eight at once to 3.3 GB); the budget holds each body until it
// is refused, and nothing is booked.
func TestTokenIDPromptBounded(t *testing.T) {
	const ids = 16_700_000
	// A budget with room for the eight bodies outside its reserve: what
	// this test checks is the token cap, not the reserve's hold on bodies
	// that stall (which a loaded machine's uploads can, for 2 s;
	// TestStalledBodiesLeaveTheReserve checks that).
	s := startStack(t, proxy.Config{BodyBudget: 1 << 30}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	body := []byte(`{"model":"m","max_tokens":1,"prompt":[` + strings.Repeat("1,", ids-1) + `1]}`)
	send := func() (int, string) {
		resp, err := http.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	selections := func() float64 { return s.routed() }
	if code, b := s.post("/v1/completions", map[string]any{"model": model, "prompt": []int{1, 2, 3}, "max_tokens": 1}); code != 200 {
		t.Fatalf("a prompt of 3 token ids: %d %s", code, b)
	}
	booked := selections()
	if booked != 1 {
		t.Fatalf("prefixd booked %v requests, want 1", booked)
	}
	for _, n := range []int{1, 8} {
		before := heap()
		stop := peakHeap()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if code, b := send(); code != 413 || !strings.Contains(b, `"message":"prompt: more than 1000000 tokens"`) {
					t.Errorf("%d MB of token ids: %d %s", len(body)>>20, code, b)
				}
			})
		}
		wg.Wait()
		peak := stop() - before
		t.Logf("%d at once: peak heap growth %.0f MiB (%d bodies of %.1f MiB)", n, float64(peak)/mib, n, float64(len(body))/mib)
		if bound := int64(n) * 3 * int64(len(body)); peak > bound {
			t.Errorf("%d at once: the heap grew by %.0f MiB, more than %.0f MiB", n, float64(peak)/mib, float64(bound)/mib)
		}
		testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return s.proxy.BodyBytes() == 0 })
	}
	if got := selections(); got != booked {
		t.Errorf("prefixd booked %v requests after the refused prompts, %v before", got, booked)
	}
}

// routed is how many selections prefixd made (the count of
// prefixd_selection_overlap_tokens, one per selection or plan booking,
// over its kinds). Not prefixd_routed_total: its series are per worker
// rank and go with the rank, so a worker whose lease lapses on a loaded
// machine and registers again takes its count back to zero.
func (s *stack) routed() float64 {
	s.t.Helper()
	m, err := s.prefixd.Metrics(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	var n float64
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, "prefixd_selection_overlap_tokens_count{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += v
		}
	}
	return n
}

// TestOverLimitPrompts: a prompt prefixd would refuse — more token ids
// than it routes, given by the client or counted by the engine's
// tokenizer, or ids that do not fit in a body it accepts — gets one clear
// 413 from the proxy, before anything is booked, aggregated or
// disaggregated (it got a 404 naming prefixd's own limits, or was routed
// by load and got a 502).
func TestOverLimitPrompts(t *testing.T) {
	words := func(n int) string { return "a" + strings.Repeat(" a", n-1) }
	ids := func(n int, id string) string { return "[" + strings.Repeat(id+",", n-1) + id + "]" }
	cases := []struct {
		name, path, body, want string
	}{
		{"ids over the count", "/v1/completions", `{"model":"m","max_tokens":1,"prompt":` + ids(1_000_001, "7") + `}`,
			`"prompt: more than 1000000 tokens"`},
		{"a batch's first ids over the count", "/v1/completions", `{"model":"m","max_tokens":1,"prompt":[` + ids(1_000_001, "7") + `]}`,
			`"prompt[0]: more than 1000000 tokens"`},
		{"ids over prefixd's body limit", "/v1/completions", `{"model":"m","max_tokens":1,"prompt":` + ids(1_000_000, "4294967295") + `}`,
			`"prompt: its 1000000 token ids take 11000001 bytes as JSON, more than the 8323072 a prompt may take to be routed"`},
		{"text over the count", "/v1/completions", `{"model":"m","max_tokens":1,"prompt":"` + words(1_000_001) + `"}`,
			`"prompt: more than 1000000 tokens (by the engine's tokenizer)"`},
		{"chat over the count", "/v1/chat/completions", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + words(1_000_000) + `"}]}`,
			`"prompt: more than 1000000 tokens (by the engine's tokenizer)"`},
	}
	for _, disagg := range []bool{false, true} {
		t.Run(map[bool]string{false: "aggregated", true: "disaggregated"}[disagg], func(t *testing.T) {
			var s *stack
			if disagg {
				s = disaggStack(t, proxy.Config{})
			} else {
				s = startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
			}
			booked := s.routed()
			for _, c := range cases {
				resp, err := http.Post(s.url+c.path, "application/json", strings.NewReader(c.body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 413 || !strings.Contains(string(b), `"message":`+c.want) || !strings.Contains(string(b), `"type":"BadRequestError"`) {
					t.Errorf("%s: %d %s", c.name, resp.StatusCode, clipped(b))
				}
			}
			if got := s.routed(); got != booked {
				t.Errorf("prefixd booked %v requests for over-limit prompts", got-booked)
			}
		})
	}
}

// clipped shortens an answer quoted in a failure.
func clipped(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// TestPassThroughOnlyListed: the proxy passes to an engine only the
// routes a client needs (vLLM's tokenizer) or those it is told to; any
// other path is a 404 naming it (clipped), and never reaches an engine
// (POST /faults/fail did: a client without a token could fail the
// engines' requests, as it could reach vLLM's admin routes).
func TestPassThroughOnlyListed(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	for _, c := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"POST", "/faults/fail?status=500&count=100", 404, `"message":"/faults/fail: no such route (the proxy passes only /tokenize, /detokenize to the engines)"`},
		{"POST", "/faults/stall_replay", 404, `"message":"/faults/stall_replay: no such route`},
		{"GET", "/" + strings.Repeat("x", 200), 404, `"message":"/` + strings.Repeat("x", 63) + `… (201 bytes): no such route`},
		{"GET", "/v1/completions", 405, `"message":"GET /v1/completions: method not allowed (POST only)"`},
		{"POST", "/v1/models", 405, `"message":"POST /v1/models: method not allowed (GET only)"`},
	} {
		req, _ := http.NewRequest(c.method, s.url+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		typ := map[int]string{404: "NotFoundError", 405: "MethodNotAllowedError"}[c.code]
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.want) || !strings.Contains(string(b), `"type":"`+typ+`"`) {
			t.Errorf("%s %s: %d %s", c.method, clipped([]byte(c.path)), resp.StatusCode, b)
		}
	}
	// The fault was not armed: the engine serves.
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2}); code != 200 {
		t.Fatalf("after the refused fault: %d %s", code, body)
	}
	if code, body := s.post("/tokenize", map[string]any{"model": model, "prompt": "a b c"}); code != 200 || !strings.Contains(body, `"tokens"`) {
		t.Fatalf("pass-through /tokenize: %d %s", code, body)
	}

	// A route given with PassThrough is passed; the defaults are not.
	s = startStack(t, proxy.Config{PassThrough: []string{"/faults/fail"}}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	resp, err := http.Post(s.url+"/faults/fail?count=0", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("a listed route: %d", resp.StatusCode)
	}
	if code, body := s.post("/tokenize", map[string]any{"model": model, "prompt": "a b c"}); code != 404 || !strings.Contains(body, "passes only /faults/fail") {
		t.Errorf("/tokenize, not listed: %d %s", code, body)
	}
}

// TestProxyClosesAfterChunked: the proxy answers a request with both
// Content-Length and Transfer-Encoding with its connection closed
// (httpbody.CloseChunked), as RFC 9112 §6.3 requires.
func TestProxyClosesAfterChunked(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"` + model + `","prompt":"hello there","max_tokens":2}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("%d close=%v %s; want 200 and the connection closed", resp.StatusCode, resp.Close, b)
	}
}
