// Package apiserver serves prefixd's HTTP API over the index, the worker
// catalog and the coordinator. NewHandler returns the handler and
// NewServer the http.Server to serve it with (its read timeouts and
// header limit); the caller owns the listener, and httpserve.Serve runs
// the server until a context ends, then drains it. The request and
// response types are package api's, the ones routers and the Go client
// use; this package maps them onto the catalog's and the coordinator's
// types and their errors onto statuses.
//
// The routes and shapes are those of Dynamo's standalone indexer (and the
// Mooncake KV indexer RFC), so its clients work unchanged:
//
//	POST /register       api.RegisterRequest → 201 {"status":"ok"}; 400, 409 (block-size conflict), 503 (no catalog)
//	POST /unregister     api.UnregisterRequest → 200 {"status":"ok"}; 404 if not registered
//	GET  /workers        ?model_name=&routing_group= (both optional) → [api.WorkerInfo] ([] when none)
//	POST /query          api.QueryRequest → api.ScoreResponse; 404 "no indexer for model=… routing_group=…"
//	POST /query_by_hash  api.QueryByHashRequest → api.ScoreResponse; 404 as /query
//	GET  /dump           {"<model>:<group>": a snapshot as WriteSnapshot writes it, …}; a failing partition as {"error": …}
//	GET  /health         200 {"status":"ok"}
//	GET  /ready          200 {"status":"ok"}, or 503 {"status":"not ready","reason":…}
//	GET  /metrics        Config.Metrics (Prometheus text); 404 when nil
//
// and the selection, reservation and plan routes of selection.go.
//
// Differences from Dynamo, all additive: api.WorkerInfo carries per-rank
// last_seq, degraded and block counts and the catalog fields;
// api.RegisterRequest takes prefixd's optional api.Extensions; a bearer
// token can guard the writes and /dump (Config.APIToken) and the other
// reads but the probes (Config.ReadToken; see accessOf); bodies and token
// counts are limited (413). Like Dynamo, request bodies are read whatever
// their Content-Type, and unknown fields are ignored (forward
// compatibility), so a misspelt optional field is silently ignored too.
//
// Errors are JSON {"error": "<field>: <problem>"}, e.g. "token_ids[3]: -1
// is out of range [0, 4294967295]" or "body: invalid JSON at offset 17:
// …"; an unknown path is a 404 ("path: …") and a wrong method a 405
// ("method: …") with an Allow header.
package apiserver
