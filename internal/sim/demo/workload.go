package demo

import (
	"math/rand/v2"

	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// Workload returns the demo's deterministic chat traffic: Conversations
// conversations, each opened on one of SystemPrompts shared system
// prompts, take turns in random order; a turn's prompt is the system
// prompt, the history (earlier user messages and answers) and a new user
// message. A conversation that grows past 2,500 tokens starts over on a
// new system prompt. Every routing mode replays the same list.
func Workload(cfg Config) []mocker.Request {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	next := uint32(1_000_000) // fresh token ids: user messages and answers never repeat
	fresh := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	system := make([][]uint32, cfg.SystemPrompts)
	for i := range system {
		system[i] = make([]uint32, cfg.SystemTokens)
		for j := range system[i] {
			system[i][j] = uint32(i*cfg.SystemTokens + j + 1)
		}
	}
	// Popular system prompts are used more (weights 1/(i+1)).
	pickSystem := func() []uint32 {
		for {
			i := rng.IntN(cfg.SystemPrompts)
			if rng.Float64() < 1/float64(i+1) {
				return system[i]
			}
		}
	}
	convs := make([][]uint32, cfg.Conversations)
	for i := range convs {
		convs[i] = append([]uint32(nil), pickSystem()...)
	}
	out := make([]mocker.Request, 0, cfg.Requests)
	for len(out) < cfg.Requests {
		c := rng.IntN(len(convs))
		if len(convs[c]) > 2500 {
			convs[c] = append([]uint32(nil), pickSystem()...)
		}
		prompt := append(convs[c], fresh(32+rng.IntN(128))...)
		answer := 16 + rng.IntN(48)
		out = append(out, mocker.Request{TokenIDs: prompt[:len(prompt):len(prompt)], MaxTokens: answer})
		convs[c] = append(prompt, fresh(answer)...)
	}
	return out
}
