package routing

import (
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// arriveDisagg plans r decode-first: a bypass runs it whole on the decode
// engine; otherwise prefill (one output token) runs on the plan's prefill
// engine and, when it ends, decode on the decode engine receives the KV.
func (s *sim) arriveDisagg(r *request) {
	p, err := s.replicas[r.replica].svc.Plan(coordinator.Request{ID: r.id, Model: model, PrefillGroup: group, DecodeGroup: group, Tokens: r.tokens})
	if err != nil || p.Decode == nil {
		s.fail(r)
		return
	}
	r.decode = s.byRank[p.Decode.Rank]
	if p.IsBypass() || p.Prefill == nil {
		s.bypass++
		r.stage = stageDecode
		s.start(r, r.decode, &mocker.Seq{Tokens: r.tokens, MaxTokens: r.output})
		return
	}
	r.stage = stagePrefill
	s.start(r, s.byRank[p.Prefill.Rank], &mocker.Seq{Tokens: r.tokens, MaxTokens: 1})
}

// prefillDone hands r's KV to its decode engine.
func (s *sim) prefillDone(r *request) {
	_, _ = s.replicas[r.replica].svc.PrefillComplete(r.id)
	r.stage = stageDecode
	s.start(r, r.decode, &mocker.Seq{Tokens: r.tokens, MaxTokens: r.output, RemoteKV: true})
}

// release frees what r's plan still holds.
func (s *sim) release(r *request) { _, _ = s.replicas[r.replica].svc.Release(r.id) }
