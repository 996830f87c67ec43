// Package api is prefixd's HTTP API, the one transport adapter over the
// index and the worker catalog: it is the only prefixd package that
// imports net/http. NewHandler returns the handler and NewServer the
// http.Server to serve it with (its read timeouts and header limit); the
// caller owns the listener, and Serve runs the server until a context
// ends, then drains it.
//
// The routes and shapes are those of Dynamo's standalone indexer (and the
// Mooncake KV indexer RFC), so its clients work unchanged:
//
//	POST /register       RegisterRequest → 201 {"status":"ok"}; 400, 409 (block-size conflict), 503 (no catalog)
//	POST /unregister     UnregisterRequest → 200 {"status":"ok"}; 404 if not registered
//	GET  /workers        ?model_name=&routing_group= (both optional) → [WorkerInfo] ([] when none)
//	POST /query          QueryRequest → ScoreResponse; 404 "no indexer for model=… routing_group=…"
//	POST /query_by_hash  QueryByHashRequest → ScoreResponse; 404 as /query
//	GET  /dump           {"<model>:<group>": indexer.Snapshot JSON, …}; a failing partition as {"error": …}
//	GET  /health         200 {"status":"ok"}
//	GET  /ready          200 {"status":"ok"}, or 503 {"status":"not ready","reason":…}
//	GET  /metrics        Config.Metrics (Prometheus text); 404 when nil
//
// Differences from Dynamo, all additive: WorkerInfo carries per-rank
// last_seq, degraded and block counts and the catalog fields; RegisterRequest
// takes prefixd's optional Extensions; a bearer token can guard the writes
// and /dump (Config.APIToken) and the other reads but the probes
// (Config.ReadToken; see accessOf); bodies and token counts are
// limited (413). Like Dynamo, request bodies are read whatever their
// Content-Type, and unknown fields are ignored (forward compatibility), so a
// misspelt optional field is silently ignored too.
//
// Errors are JSON {"error": "<field>: <problem>"}, e.g. "token_ids[3]: -1 is
// out of range [0, 4294967295]" or "body: invalid JSON at offset 17: …";
// an unknown path is a 404 ("path: …") and a wrong method a 405 ("method:
// …") with an Allow header.
package api
