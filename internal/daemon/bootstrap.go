package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prefixd/prefixd/indexer"
)

// Bootstrap restores every partition from the /dump of the first peer that
// answers /health, and returns that peer. Each restored rank keeps its
// watermark and digest, so its stream resumes after it once the engine
// confirms the batch (see events.Cursor.Resume) instead of replaying from
// the start, which a long-running engine's replay buffer no longer holds.
// Peers that fail are logged and skipped; no peer answering is an error.
func Bootstrap(ctx context.Context, peers []string, ix *indexer.Index, hc *http.Client, log *slog.Logger) (string, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	var errs []string
	for _, peer := range peers {
		peer = strings.TrimRight(peer, "/")
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
	if _, err := get(ctx, hc, peer+"/health"); err != nil {
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
