package peer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
)

// Limits on a peer's /dump. A dump takes some hundred bytes of JSON per
// entry, more when its events are short (apiserver's
// BenchmarkWriteSnapshot measures the benchmark workload's); the byte
// limit allows several times that per entry the index's cap admits.
const (
	dumpBytesPerEntry = 2 << 10
	minDumpBytes      = 64 << 20
	uncappedDumpBytes = 16 << 30 // when the index has no cap
)

// dumpLimits bound what bootstrapFrom reads of a peer's dump.
type dumpLimits struct {
	bytes  int64
	blocks int // 0 = none
}

// limitsFor returns the limits for bootstrapping ix: its cap in blocks,
// and dumpBytesPerEntry bytes per entry of it.
func limitsFor(ix *indexer.Index) dumpLimits {
	if n := ix.MaxEntries(); n > 0 {
		return dumpLimits{bytes: max(minDumpBytes, int64(n)*dumpBytesPerEntry), blocks: n}
	}
	return dumpLimits{bytes: uncappedDumpBytes}
}

// Bootstrap restores every partition from the /dump of the first peer that
// answers /ready (a peer still replaying would hand over an incomplete
// index), and returns that peer. A peer written dns+http://host:port
// stands for every address host resolves to (ExpandPeers). Each restored
// rank keeps its watermark and digest, so its stream resumes after it once the engine
// confirms the batch (see cursor.Cursor.Resume) instead of replaying from
// the start, which a long-running engine's replay buffer no longer holds.
// token, when not empty, is sent to peers as "Authorization: Bearer
// <token>" (a peer configured with an API token requires it on /dump).
//
// The dump is decoded as it arrives, one partition at a time, and each
// partition is restored before the next is read, so memory holds one
// partition's snapshot, not the dump. It is limited to the index's cap in
// blocks (when it has one; apiserver.DecodeLimits) and in bytes to
// dumpBytesPerEntry per entry of the cap (at least minDumpBytes;
// uncappedDumpBytes without a cap). Partitions restored from a peer that
// then fails are removed again, unless they existed before.
// Peers that fail are logged and skipped; no peer answering is an error.
// The dump is asked for as a replica's bootstrap (apiserver.PeerDumpHeader),
// which peers serve from slots of their own; a peer that answers 503 all
// the same (other replicas bootstrapping) is asked again after its
// Retry-After, until ctx ends.
func Bootstrap(ctx context.Context, peers []string, ix *indexer.Index, hc *http.Client, token string, log *slog.Logger) (string, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	peers, unresolved := ExpandPeers(ctx, peers, nil)
	for _, e := range unresolved {
		log.Warn("peer bootstrap: cannot resolve peer", "err", e)
	}
	for {
		errs := slices.Clone(unresolved)
		var wait time.Duration // the shortest Retry-After of a busy peer; 0: none busy
		for _, peer := range peers {
			err := bootstrapFrom(ctx, peer, ix, hc, token, limitsFor(ix))
			if err == nil {
				return peer, nil
			}
			errs = append(errs, fmt.Sprintf("%s: %v", peer, err))
			if b := (*busyError)(nil); errors.As(err, &b) {
				log.Info("peer bootstrap: the peer's dump slots are taken; asking again", "peer", peer, "retry_in", b.after)
				wait = min(cmp.Or(wait, b.after), b.after)
				continue
			}
			log.Warn("peer bootstrap failed", "peer", peer, "err", err)
		}
		if wait == 0 {
			return "", fmt.Errorf("no peer to bootstrap from: %s", strings.Join(errs, "; "))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("no peer to bootstrap from: %s: %w", strings.Join(errs, "; "), ctx.Err())
		case <-t.C:
		}
	}
}

// busyError is a peer's 503 to GET /dump: its dump slots are taken.
type busyError struct {
	after time.Duration // its Retry-After
}

func (e *busyError) Error() string {
	return fmt.Sprintf("HTTP 503: the peer's dump slots are taken (Retry-After %v)", e.after)
}

// Bounds on the wait a busy peer asks for.
const (
	minBusyWait = 100 * time.Millisecond
	maxBusyWait = 10 * time.Second
)

// errDumpTooLarge: the peer's dump is past the byte limit.
var errDumpTooLarge = errors.New("dump too large")

// limitReader is io.LimitReader with an error, not an EOF, past the limit.
type limitReader struct {
	r     io.Reader
	n     int64 // bytes left
	limit int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		// At the limit: fine if the body ends here.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("more than %d bytes: %w", l.limit, errDumpTooLarge)
		}
		return 0, err
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

func bootstrapFrom(ctx context.Context, peer string, ix *indexer.Index, hc *http.Client, token string, lim dumpLimits) (err error) {
	ready, err := get(ctx, hc, peer+"/ready", token, false)
	if err != nil {
		return err
	}
	ready.Close()
	body, err := get(ctx, hc, peer+"/dump", token, true)
	if err != nil {
		return err
	}
	defer body.Close()
	before := map[indexer.PartitionKey]bool{}
	for _, k := range ix.Partitions() {
		before[k] = true
	}
	var restored []indexer.PartitionKey
	defer func() {
		if err == nil {
			return
		}
		for _, k := range restored {
			if !before[k] {
				_ = ix.RemovePartition(k) // gone already is as good
			}
		}
	}()
	dec := json.NewDecoder(&limitReader{r: body, n: lim.bytes, limit: lim.bytes})
	if err := expectDelim(dec, '{'); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	blocks := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("dump: %w", err)
		}
		name := tok.(string) // an object key is a string
		i := strings.LastIndexByte(name, ':')
		if i < 0 {
			return fmt.Errorf("dump: partition %q is not model:routing_group", name)
		}
		var dl apiserver.DecodeLimits
		if lim.blocks > 0 {
			left := max(1, lim.blocks-blocks) // 0 would be no limit; 1 too many is caught below
			dl = apiserver.DecodeLimits{MaxBlocks: left, MaxEvents: left}
		}
		snap, err := apiserver.DecodeSnapshot(dec, dl)
		if err != nil {
			return fmt.Errorf("dump: partition %s: %w", name, err)
		}
		for _, ev := range snap.Events {
			blocks += len(ev.Blocks)
		}
		if lim.blocks > 0 && blocks > lim.blocks {
			return fmt.Errorf("dump: partition %s: more than the %d blocks the index holds: %w", name, lim.blocks, apiserver.ErrSnapshotTooLarge)
		}
		k := indexer.PartitionKey{Model: name[:i], Group: name[i+1:]}
		if err := ix.Restore(k, snap); err != nil {
			return fmt.Errorf("dump: %w", err)
		}
		restored = append(restored, k)
	}
	if err := expectDelim(dec, '}'); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("dump: data after the dump (%v)", err)
	}
	return nil
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("want %v, have %v", d, tok)
	}
	return nil
}

// ExpandPeers replaces each peer of the form dns+<scheme>://host:port[/path]
// by <scheme>://addr:port[/path] for every address host resolves to (in
// Kubernetes, a headless Service lists the ready replicas this way), in
// the resolver's order with duplicates removed; other peers pass through.
// Resolution failures are returned as messages and the peer skipped.
// lookup nil is net.DefaultResolver.LookupHost. A replica's own address
// needs no filtering: the daemon bootstraps before it listens, so it
// refuses its own connection and moves on.
func ExpandPeers(ctx context.Context, peers []string, lookup func(ctx context.Context, host string) ([]string, error)) (out, errs []string) {
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	seen := map[string]bool{}
	add := func(u string) {
		u = strings.TrimRight(u, "/")
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	for _, p := range peers {
		rest, ok := strings.CutPrefix(p, "dns+")
		if !ok {
			add(p)
			continue
		}
		u, err := url.Parse(rest)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Sprintf("%s: want dns+http://host:port", p))
			continue
		}
		addrs, err := lookup(ctx, u.Hostname())
		if err != nil || len(addrs) == 0 {
			errs = append(errs, fmt.Sprintf("%s: resolve %s: %v", p, u.Hostname(), cmp.Or(err, errors.New("no addresses"))))
			continue
		}
		for _, a := range addrs {
			v := *u
			v.Host = a
			if port := u.Port(); port != "" {
				v.Host = net.JoinHostPort(a, port)
			} else if strings.Contains(a, ":") {
				v.Host = "[" + a + "]"
			}
			add(v.String())
		}
	}
	return out, errs
}

// get GETs url (with the bearer token, if any; as a replica's
// bootstrap, if dump) and returns the body of a 200 answer; the caller
// closes it. A dump's 503 is a *busyError.
func get(ctx context.Context, hc *http.Client, url, token string, dump bool) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if dump {
		req.Header.Set(apiserver.PeerDumpHeader, apiserver.PeerDumpBootstrap)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		if dump && resp.StatusCode == http.StatusServiceUnavailable {
			after := time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
				after = time.Duration(s) * time.Second
			}
			return nil, fmt.Errorf("GET %s: %w", url, &busyError{after: min(max(after, minBusyWait), maxBusyWait)})
		}
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return resp.Body, nil
}
