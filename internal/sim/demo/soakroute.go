package demo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// The soak's routes call the API and the engines directly (its subject is
// the daemon under churn); the demo's go through prefixd proxy.

// errNotInFleet: prefixd chose a worker the demo does not run (in the
// soak, one that just crashed and is still in the catalog until its
// lease expires).
var errNotInFleet = errors.New("not an engine the demo runs")

func find(engines []*mocker.Engine, id uint64) (*mocker.Engine, error) {
	for _, e := range engines {
		if e.Worker().WorkerID == id {
			return e, nil
		}
	}
	return nil, fmt.Errorf("prefixd chose worker %d: %w", id, errNotInFleet)
}

// serve runs p on e and records it; the simulated TTFT is the prefill of
// the uncached prompt tokens.
func serve(ctx context.Context, e *mocker.Engine, p mocker.Request, m *ModeResult, cfg Config) error {
	res, err := e.Serve(ctx, p)
	if err != nil {
		return fmt.Errorf("worker %d: %w", e.Worker().WorkerID, err)
	}
	m.Requests++
	m.PromptTokens += res.PromptTokens
	m.CachedTokens += res.CachedTokens
	m.TTFT = append(m.TTFT, time.Duration(res.PromptTokens-res.CachedTokens)*cfg.PrefillPerToken)
	m.PerWorker[e.Worker().WorkerID]++
	return nil
}

func routeKV(ctx context.Context, cl *client.Client, engines []*mocker.Engine, i int, p mocker.Request, m *ModeResult, cfg Config) error {
	id := "kv-" + strconv.Itoa(i)
	sel, err := cl.SelectAndReserve(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: p.TokenIDs}, ModelName: model,
		RoutingGroup: groupKV, SelectionID: id})
	if err != nil {
		return err
	}
	e, err := find(engines, sel.WorkerID)
	if err == nil {
		err = serve(ctx, e, p, m, cfg)
	}
	return errors.Join(err, cl.FreeReservation(ctx, id))
}

// routePlan runs one request as a decode-first plan: bypass serves it on
// the decode worker; remote prefill runs the prompt on the prefill worker,
// then the decode worker receives the KV blocks (it caches the prompt, as
// after a KV transfer) and decodes.
func routePlan(ctx context.Context, cl *client.Client, engines []*mocker.Engine, i int, p mocker.Request, m *ModeResult, cfg Config) error {
	id := "plan-" + strconv.Itoa(i)
	plan, err := cl.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: p.TokenIDs}, ID: id, ModelName: model,
		RoutingGroup: groupDisagg, Policy: &api.PlanPolicy{Kind: "isl_bounding", EffISLThreshold: 256}})
	if err != nil {
		return err
	}
	if plan.Decode == nil || plan.Decision == nil {
		return fmt.Errorf("plan %s has no decode booking or decision: %+v", id, plan)
	}
	dec, err := find(engines, plan.Decode.WorkerID)
	if err != nil {
		return err
	}
	if plan.Decision.Kind == "bypass" {
		m.Bypass++
		err = serve(ctx, dec, p, m, cfg)
	} else {
		m.Remote++
		err = remotePrefill(ctx, cl, engines, plan, dec, p, m, cfg)
	}
	_, rerr := cl.ReleasePlan(ctx, id)
	return errors.Join(err, rerr)
}

func remotePrefill(ctx context.Context, cl *client.Client, engines []*mocker.Engine, plan api.PlanInfo, dec *mocker.Engine, p mocker.Request, m *ModeResult, cfg Config) error {
	if plan.Prefill == nil {
		return fmt.Errorf("plan %s: remote prefill without a prefill booking", plan.ID)
	}
	pre, err := find(engines, plan.Prefill.WorkerID)
	if err != nil {
		return err
	}
	if pre.Worker().TopologyDomains["rack"] != dec.Worker().TopologyDomains["rack"] {
		return fmt.Errorf("plan %s: prefill worker %d and decode worker %d are in different KV-transfer domains", plan.ID, pre.Worker().WorkerID, dec.Worker().WorkerID)
	}
	if err := serve(ctx, pre, mocker.Request{TokenIDs: p.TokenIDs, MaxTokens: 1}, m, cfg); err != nil {
		return err
	}
	if _, err := cl.PlanPrefillComplete(ctx, plan.ID); err != nil {
		return err
	}
	_, err = dec.Serve(ctx, p)
	return err
}
