package apiserver

import "github.com/prefixd/prefixd/api"

// promptBounds checks what the arrays' UnmarshalJSON cannot know: the
// configured limits (TokenIDs and HashList stop at the defaults, the most
// they ever allocate), and isl_tokens, at most MaxTokens, the longest
// prompt token_ids may carry.
func (h *handler) promptBounds(p *api.Prompt) *httpError {
	switch {
	case len(p.TokenIDs) > h.cfg.MaxTokens:
		return tooLarge("token_ids", "more than %d tokens", h.cfg.MaxTokens)
	case len(p.BlockHashes) > h.cfg.MaxBlockHashes:
		return tooLarge("block_hashes", "more than %d hashes", h.cfg.MaxBlockHashes)
	case p.ISLTokens < 0 || p.ISLTokens > h.cfg.MaxTokens:
		return badRequest("isl_tokens", "%d is out of range [0, %d]", p.ISLTokens, h.cfg.MaxTokens)
	}
	return nil
}
