package stream

import (
	"fmt"
	"strconv"
	"strings"
)

// OffsetEndpoint returns the endpoint a vLLM publisher of dp rank uses when
// configured with base: rank 0 keeps base; for tcp the port after the last
// ':' grows by rank; for inproc "_dp<rank>" is appended; other transports
// (ipc) cannot be offset, which vLLM rejects too. It applies to both the
// live and the replay endpoint.
func OffsetEndpoint(base string, rank uint32) (string, error) {
	if rank == 0 {
		return base, nil
	}
	switch {
	case strings.Contains(base, "inproc"):
		return fmt.Sprintf("%s_dp%d", base, rank), nil
	case strings.HasPrefix(base, "tcp://"):
		i := strings.LastIndexByte(base, ':')
		port, err := strconv.ParseUint(base[i+1:], 10, 16)
		if i < len("tcp://") || err != nil {
			return "", fmt.Errorf("endpoint %q: no port to offset by dp rank %d", base, rank)
		}
		if port+uint64(rank) > 65535 {
			return "", fmt.Errorf("endpoint %q: port %d + dp rank %d exceeds 65535", base, port, rank)
		}
		return base[:i+1] + strconv.FormatUint(port+uint64(rank), 10), nil
	}
	return "", fmt.Errorf("endpoint %q: only tcp and inproc endpoints can be offset by dp rank %d", base, rank)
}
