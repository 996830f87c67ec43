package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/prefixd/prefixd/api"
)

// maxSessionID is the longest session id the proxy passes on as it is; a
// longer one goes as "sha256:" and its 64 hex digits, as prefixd serve
// would remember it anyway, so a long id costs neither a large request
// nor memory.
const maxSessionID = 256

// sessionOf is the session a request names, for session affinity
// (api.SelectRequest.SessionID): the x-session-id header, else the
// OpenAI body's "user", else vLLM's "session_id"; "" for none. A body
// field that is not a string is ignored, as the engine's own validation
// will report it.
func sessionOf(h http.Header, r *request) string {
	id := h.Get(api.SessionHeader)
	for _, f := range []string{"user", "session_id"} {
		if id != "" {
			break
		}
		if raw, ok := r.Fields[f]; ok {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				id = s
			}
		}
	}
	if len(id) > maxSessionID {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return id
}
