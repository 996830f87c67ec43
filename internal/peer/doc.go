// Package peer bootstraps a replica's index from its peers: at start,
// before the daemon serves, Bootstrap asks each peer's /ready, takes the
// first ready one's GET /dump and restores it into the index one
// partition at a time, within limits on entries and bytes; a peer given
// as dns+http://host:port stands for every address host resolves to (a
// headless Service of replicas). Each restored rank then resumes its
// stream after the watermark the dump carries, once the engine confirms
// that batch's digest.
package peer
