package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

func startGateway(t *testing.T, cfg Config) (*Gateway, string) {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		srv.Close()
		if err := g.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return g, srv.URL
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func post(t *testing.T, url, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return do(t, req)
}

func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// route is a decision sending the request to ep, with the header and
// the metadata agreeing.
func route(ep string) decision { return decision{header: ep, meta: ep} }

// TestGatewayStreamed: in FULL_DUPLEX_STREAMED the picker gets the
// headers (end_of_stream false, the pseudo-headers, the client's headers,
// the subset hint, the body modes), then the body chunk by chunk as the
// client sends it (the next chunk sent only once the picker has the
// previous: nothing waits for the whole body), and an empty last chunk
// with end_of_stream; the upstream gets the body the picker passed back
// with the headers it set and without those it removed; the picker then
// gets the response headers with the endpoint that served, and the body;
// the client gets what the picker passed back.
func TestGatewayStreamed(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(_ *corev3.HeaderMap, body []byte) decision {
		d := route(up.addr)
		d.set = map[string]string{"x-prefiller-host-port": "10.0.0.9:8000"}
		d.remove = []string{"x-drop"}
		d.body = func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("alias"), []byte("model-7")) }
		d.respHeader = map[string]string{"x-picked": "yes"}
		return d
	}))
	g, url := startGateway(t, Config{EPP: epp, Subset: func(r *http.Request) ([]string, bool) {
		return []string{"10.1.1.1:80", up.addr}, r.Header.Get("X-Subset") == "yes"
	}})

	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions?x=1", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "req-1")
	req.Header.Set("X-Drop", "yes")
	req.Header.Set("X-Subset", "yes")
	type result struct {
		resp *http.Response
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp, string(b), err}
	}()
	if _, err := io.WriteString(pw, `{"model":"alias",`); err != nil {
		t.Fatal(err)
	}
	tr.waitFor(t, `request_body "{\"model\":\"alias\"," eos=false`)
	if _, err := io.WriteString(pw, `"prompt":"hi"}`); err != nil {
		t.Fatal(err)
	}
	tr.waitFor(t, `request_body "\"prompt\":\"hi\"}" eos=false`)
	pw.Close()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	wantBody := "u1 POST /v1/completions?x=1 host=" + strings.TrimPrefix(url, "http://") + " headers=[x-prefiller-host-port=10.0.0.9:8000 x-request-id=req-1 " +
		DestinationHeader + "=" + up.addr + " content-type=application/json] body={\"model\":\"model-7\",\"prompt\":\"hi\"}"
	if res.resp.StatusCode != 200 || res.body != wantBody || res.resp.Header.Get("X-Picked") != "yes" {
		t.Fatalf("client got %d %v\n %q\nwant %q", res.resp.StatusCode, res.resp.Header, res.body, wantBody)
	}
	subset := " meta envoy.lb.subset_hint=map[" + SubsetKey + ":[10.1.1.1:80 " + up.addr + "]]"
	sameLines(t, "picker received", tr.Lines(), []string{
		"request_headers eos=false :path=/v1/completions?x=1 :method=POST :scheme=http content-type=application/json x-drop=yes x-request-id=req-1 x-subset=yes" +
			subset + " protocol=FULL_DUPLEX_STREAMED/FULL_DUPLEX_STREAMED",
		`request_body "{\"model\":\"alias\"," eos=false` + subset,
		`request_body "\"prompt\":\"hi\"}" eos=false` + subset,
		`request_body "" eos=true` + subset,
		"response_headers eos=false :status=200 meta envoy.lb=map[" + ServedKey + ":" + up.addr + "]",
		`response_body "` + strings.ReplaceAll(wantBody, `"`, `\"`) + `" eos=true`,
		"end EOF",
	})
	if st := g.Stats(); st.Requests != 1 || st.ProtocolErrors+st.EPPFailures+st.Fallbacks+st.FailOpen != 0 || len(st.Immediate) != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGatewayBuffered: in BUFFERED the picker answers the headers, then
// gets the whole body in one message with end_of_stream and answers it
// with the destination, a header and a body mutation; the response's
// headers and whole body go through it the same way, and the client gets
// the body the picker passed back with its Content-Length.
func TestGatewayBuffered(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, Buffered, func(_ *corev3.HeaderMap, body []byte) decision {
		d := route(up.addr)
		d.set = map[string]string{"x-prefiller-host-port": "10.0.0.9:8000"}
		d.body = func(b []byte) []byte { return append([]byte("rewritten "), b...) }
		d.respHeader = map[string]string{"x-picked": "yes"}
		d.respBody = func(b []byte) []byte { return append([]byte("picked: "), b...) }
		return d
	}))
	g, url := startGateway(t, Config{EPP: epp, RequestBodyMode: Buffered, ResponseBodyMode: Buffered})
	resp, body := post(t, url+"/v1/chat/completions", `{"prompt":"hi"}`, map[string]string{"Content-Type": "application/json"})
	upBody := "u1 POST /v1/chat/completions host=" + strings.TrimPrefix(url, "http://") + " headers=[x-prefiller-host-port=10.0.0.9:8000 " +
		DestinationHeader + "=" + up.addr + " content-type=application/json] body=rewritten {\"prompt\":\"hi\"}"
	if resp.StatusCode != 200 || body != "picked: "+upBody || resp.Header.Get("X-Picked") != "yes" || resp.ContentLength != int64(len(body)) {
		t.Fatalf("client got %d %v %q", resp.StatusCode, resp.Header, body)
	}
	sameLines(t, "picker received", tr.Lines(), []string{
		"request_headers eos=false :path=/v1/chat/completions :method=POST :scheme=http content-type=application/json content-length=15 protocol=BUFFERED/BUFFERED",
		`request_body "{\"prompt\":\"hi\"}" eos=true`,
		"response_headers eos=false :status=200 meta envoy.lb=map[" + ServedKey + ":" + up.addr + "]",
		`response_body "` + strings.ReplaceAll(upBody, `"`, `\"`) + `" eos=true`,
		"end EOF",
	})
	if st := g.Stats(); st.Requests != 1 || st.ProtocolErrors+st.EPPFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGatewayNoBody: a request without a body is its headers with
// end_of_stream, answered with the destination at once, in both modes.
func TestGatewayNoBody(t *testing.T) {
	t.Parallel()
	for _, mode := range []BodyMode{FullDuplexStreamed, Buffered} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t, "u1", http.StatusOK)
			tr := newTranscript()
			epp := startEPP(t, nil, picker(tr, mode, func(*corev3.HeaderMap, []byte) decision { return route(up.addr) }))
			_, url := startGateway(t, Config{EPP: epp, RequestBodyMode: mode, ResponseBodyMode: mode})
			req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := do(t, req)
			if resp.StatusCode != 200 || !strings.HasPrefix(body, "u1 GET /v1/models ") || !strings.HasSuffix(body, "body=") {
				t.Fatalf("client got %d %q", resp.StatusCode, body)
			}
			lines := tr.Lines()
			if len(lines) != 4 || lines[0] != "request_headers eos=true :path=/v1/models :method=GET :scheme=http protocol="+mode.String()+"/"+mode.String() ||
				!strings.HasPrefix(lines[1], "response_headers eos=false :status=200") || !strings.HasPrefix(lines[2], `response_body "u1 GET`) ||
				!strings.HasSuffix(lines[2], "eos=true") || lines[3] != "end EOF" {
				t.Fatalf("picker received %q", lines)
			}
		})
	}
}

// TestGatewayDestinationErrors: the destination must be in the header and
// the metadata, equal, and a list of ip:port; otherwise the request goes
// nowhere and the protocol error is counted.
func TestGatewayDestinationErrors(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	many := strings.Repeat(up.addr+",", MaxEndpoints) + up.addr
	for _, tc := range []struct {
		name         string
		header, meta string
		status       int
		contains     string
	}{
		{"header only", up.addr, "", 500, "metadata (none) differ"},
		{"metadata only", "", up.addr, 500, "destination header (none)"},
		{"different", up.addr, "127.0.0.1:1", 500, "differ"},
		{"neither", "", "", 503, "named no destination"},
		{"a name", "localhost:80", "localhost:80", 500, "want ip:port"},
		{"port 0", "127.0.0.1:0", "127.0.0.1:0", 500, "port from 1 to 65535"},
		{"empty entry", up.addr + ",", up.addr + ",", 500, "entry 1"},
		{"too many", many, many, 500, "more than 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newTranscript()
			epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision {
				return decision{header: tc.header, meta: tc.meta}
			}))
			g, url := startGateway(t, Config{EPP: epp})
			resp, body := post(t, url+"/v1/completions", `{"prompt":"hi"}`, nil)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.contains) || len(body) > 512 {
				t.Fatalf("client got %d %q; want %d with %q", resp.StatusCode, body, tc.status, tc.contains)
			}
			if st := g.Stats(); st.ProtocolErrors != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}

// TestGatewayFallback: the endpoints are tried in order while the
// connection fails; one that answers, even a 500, serves; the picker is
// told which served.
func TestGatewayFallback(t *testing.T) {
	t.Parallel()
	u1, u2 := startUpstream(t, "u1", http.StatusOK), startUpstream(t, "u2", http.StatusOK)
	u500 := startUpstream(t, "u500", http.StatusInternalServerError)
	dead1, dead2 := closedAddr(t), closedAddr(t)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(h *corev3.HeaderMap, _ []byte) decision {
		return route(headerValue(h, "x-dest"))
	}))
	g, url := startGateway(t, Config{EPP: epp})
	for _, tc := range []struct {
		dest      string
		status    int
		prefix    string
		served    string
		fallbacks uint64
	}{
		{dead1 + "," + dead2 + "," + u1.addr + "," + u2.addr, 200, "u1 POST", u1.addr, 1},
		{u500.addr + "," + u1.addr, 500, "u500 POST", u500.addr, 1},
		{dead1 + ", " + dead2, 503, "upstream connect error", "", 1},
	} {
		before := len(tr.Lines())
		resp, body := post(t, url+"/v1/completions", `{"prompt":"hi"}`, map[string]string{"X-Dest": tc.dest})
		if resp.StatusCode != tc.status || !strings.HasPrefix(body, tc.prefix) {
			t.Fatalf("%s: client got %d %q", tc.dest, resp.StatusCode, body)
		}
		lines := tr.Lines()[before:]
		served := slices.ContainsFunc(lines, func(l string) bool {
			return strings.HasPrefix(l, "response_headers eos=false :status=") && strings.HasSuffix(l, ServedKey+":"+tc.served+"]")
		})
		if served != (tc.served != "") {
			t.Fatalf("%s: picker received %q, want served %q", tc.dest, lines, tc.served)
		}
		if st := g.Stats(); st.Fallbacks != tc.fallbacks {
			t.Fatalf("%s: stats %+v", tc.dest, st)
		}
	}
	if u2.hits.Load() != 0 || u1.hits.Load() != 1 || u500.hits.Load() != 1 {
		t.Fatalf("hits u1 %d u2 %d u500 %d", u1.hits.Load(), u2.hits.Load(), u500.hits.Load())
	}
}

// TestGatewayImmediateResponse: an ImmediateResponse is relayed as it is
// (status, headers, body; text/plain by default) and the request goes
// nowhere, at the headers or after the body, in both modes.
func TestGatewayImmediateResponse(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	openAI := `{"error":{"message":"every engine is busy","type":"TooManyRequests","param":null,"code":429}}`
	for _, mode := range []BodyMode{FullDuplexStreamed, Buffered} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			tr := newTranscript()
			epp := startEPP(t, nil, picker(tr, mode, func(h *corev3.HeaderMap, body []byte) decision {
				if body == nil {
					return decision{immediate: &extprocImmediateNoHeaders}
				}
				return decision{immediate: immediateResponse(typev3.StatusCode_TooManyRequests, "application/json", openAI)}
			}))
			g, url := startGateway(t, Config{EPP: epp, RequestBodyMode: mode, ResponseBodyMode: mode})
			resp, body := post(t, url+"/v1/completions", `{"prompt":"hi"}`, nil)
			if resp.StatusCode != 429 || body != openAI || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("client got %d %v %q", resp.StatusCode, resp.Header, body)
			}
			req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, body = do(t, req)
			if resp.StatusCode != 503 || body != "no ready engine" || resp.Header.Get("Content-Type") != "text/plain" {
				t.Fatalf("client got %d %v %q", resp.StatusCode, resp.Header, body)
			}
			if st := g.Stats(); st.Immediate[429] != 1 || st.Immediate[503] != 1 || st.ProtocolErrors != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}

var extprocImmediateNoHeaders = extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable}, Body: []byte("no ready engine")}

// sseUpstream streams "data: 1", then waits for gate (or the client to
// go), then "data: 2" and [DONE]; gone is closed when its client went
// away.
func sseUpstream(t *testing.T, gate <-chan struct{}) (addr string, gone <-chan struct{}) {
	t.Helper()
	g := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			close(g)
			return
		}
		_, _ = io.WriteString(w, "data: 2\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), g
}

// readEvent reads one server-sent event's data line within 30 s.
func readEvent(t *testing.T, rd *bufio.Reader) string {
	t.Helper()
	type line struct {
		s   string
		err error
	}
	ch := make(chan line, 1)
	go func() {
		var l line
		l.s, l.err = rd.ReadString('\n')
		if l.err == nil {
			_, l.err = rd.ReadString('\n') // the blank line
		}
		ch <- l
	}()
	select {
	case l := <-ch:
		if l.err != nil {
			t.Fatal(l.err)
		}
		return strings.TrimSpace(l.s)
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30 s: the gateway holds the stream back")
	}
	return ""
}

// TestGatewaySSEStreams: a server-sent event reaches the client before
// the upstream writes the next (the upstream waits for the client to have
// it), through the picker chunk by chunk.
func TestGatewaySSEStreams(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	addr, _ := sseUpstream(t, gate)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision { return route(addr) }))
	_, url := startGateway(t, Config{EPP: epp})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	if ev := readEvent(t, rd); ev != "data: 1" {
		t.Fatalf("first event %q", ev)
	}
	close(gate)
	for _, want := range []string{"data: 2", "data: [DONE]"} {
		if ev := readEvent(t, rd); ev != want {
			t.Fatalf("event %q, want %q", ev, want)
		}
	}
	if rest, err := io.ReadAll(rd); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q %v", rest, err)
	}
	tr.waitFor(t, "end EOF")
	var bodies []string
	for _, l := range tr.Lines() {
		if strings.HasPrefix(l, "response_body") {
			bodies = append(bodies, l)
		}
	}
	if len(bodies) < 2 || bodies[0] != `response_body "data: 1\n\n" eos=false` || !strings.HasSuffix(bodies[len(bodies)-1], "eos=true") {
		t.Fatalf("picker received the response body as %q", bodies)
	}
}

// TestGatewayClientDisconnect: a client that goes away mid-stream resets
// the picker's stream (its Recv fails with Canceled) and the upstream
// request.
func TestGatewayClientDisconnect(t *testing.T) {
	t.Parallel()
	addr, gone := sseUpstream(t, nil)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision { return route(addr) }))
	g, url := startGateway(t, Config{EPP: epp})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ev := readEvent(t, bufio.NewReader(resp.Body)); ev != "data: 1" {
		t.Fatalf("first event %q", ev)
	}
	cancel()
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	tr.waitFor(t, "end Canceled")
	if st := g.Stats(); st.ProtocolErrors+st.EPPFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGatewayBodyTooLarge: a request body beyond MaxRequestBody is a 413
// and goes nowhere, in both modes.
func TestGatewayBodyTooLarge(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, "u1", http.StatusOK)
	for _, mode := range []BodyMode{FullDuplexStreamed, Buffered} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			tr := newTranscript()
			epp := startEPP(t, nil, picker(tr, mode, func(*corev3.HeaderMap, []byte) decision { return route(up.addr) }))
			_, url := startGateway(t, Config{EPP: epp, RequestBodyMode: mode, MaxRequestBody: 64})
			resp, body := post(t, url+"/v1/completions", strings.Repeat("x", 1000), nil)
			if resp.StatusCode != 413 || body != "request body larger than 64 bytes" {
				t.Fatalf("client got %d %q", resp.StatusCode, body)
			}
		})
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}
