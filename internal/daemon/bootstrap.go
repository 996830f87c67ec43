package daemon

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
	"strings"

	"github.com/prefixd/prefixd/indexer"
)

// Bootstrap restores every partition from the /dump of the first peer that
// answers /ready (a peer still replaying would hand over an incomplete
// index), and returns that peer. A peer written dns+http://host:port
// stands for every address host resolves to (ExpandPeers). Each restored
// rank keeps its watermark and digest, so its stream resumes after it once the engine
// confirms the batch (see events.Cursor.Resume) instead of replaying from
// the start, which a long-running engine's replay buffer no longer holds.
// Peers that fail are logged and skipped; no peer answering is an error.
func Bootstrap(ctx context.Context, peers []string, ix *indexer.Index, hc *http.Client, log *slog.Logger) (string, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	peers, errs := ExpandPeers(ctx, peers, nil)
	for _, e := range errs {
		log.Warn("peer bootstrap: cannot resolve peer", "err", e)
	}
	for _, peer := range peers {
		if err := bootstrapFrom(ctx, peer, ix, hc); err != nil {
			log.Warn("peer bootstrap failed", "peer", peer, "err", err)
			errs = append(errs, fmt.Sprintf("%s: %v", peer, err))
			continue
		}
		return peer, nil
	}
	return "", fmt.Errorf("no peer to bootstrap from: %s", strings.Join(errs, "; "))
}

func bootstrapFrom(ctx context.Context, peer string, ix *indexer.Index, hc *http.Client) error {
	if _, err := get(ctx, hc, peer+"/ready"); err != nil {
		return err
	}
	raw, err := get(ctx, hc, peer+"/dump")
	if err != nil {
		return err
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	for name, body := range parts {
		i := strings.LastIndexByte(name, ':')
		if i < 0 {
			return fmt.Errorf("dump: partition %q is not model:routing_group", name)
		}
		var probe struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &probe) == nil && probe.Error != "" {
			return fmt.Errorf("dump: partition %s: %s", name, probe.Error)
		}
		var snap indexer.Snapshot
		if err := json.Unmarshal(body, &snap); err != nil {
			return fmt.Errorf("dump: partition %s: %w", name, err)
		}
		if err := ix.Restore(indexer.PartitionKey{Model: name[:i], Group: name[i+1:]}, &snap); err != nil {
			return fmt.Errorf("dump: %w", err)
		}
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

func get(ctx context.Context, hc *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return io.ReadAll(resp.Body)
}
