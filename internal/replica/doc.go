// Package replica shares bookings between the replicas of prefixd that
// serve one catalog, so that every replica selects with the load booked
// through all of them (issue 32).
//
// Each replica keeps a record in the catalog (catalog.Replica, under its
// own lease) and serves a gRPC stream of its booking deltas
// (coordinator.BookingDelta) on its sync address. Every replica
// subscribes to every other it finds in the catalog: a stream starts
// with a snapshot of the peer's live bookings and continues with its
// deltas as they happen, which the subscriber applies to its own
// coordinator.Service (ResetPeer, then ApplyPeer a message at a time).
// A peer whose record leaves the catalog (stopped, or killed and its
// lease expired) has its bookings dropped (DropPeer).
//
// Why a direct gRPC stream, not a message bus: the deltas go from one
// process to a handful of others, at the rate of admissions; a stream
// per pair over the cluster network is one hop (BenchmarkDeltaLatency
// measures it over loopback), and an operator runs nothing beyond prefixd
// and etcd, where NATS would be one more server to deploy, secure and
// watch. grpc-go is already prefixd's gRPC (the endpoint picker);
// messages are MessagePack (tinylib/msgp, prefixd's event decoder's
// library) through a gRPC codec, as protobuf code generation is not part
// of the build.
//
// Why subscribe, not push: the replica that needs the bookings owns the
// connection, so it alone decides when to connect, back off and resync
// (a snapshot per stream makes a restarted or reconnected peer start
// clean), and the sender only fans out to the streams it has.
//
// Bounds: the sender keeps at most Config.SendBuffer deltas per
// subscriber; a subscriber that falls behind has its stream ended and
// the deltas counted as dropped (selection never waits for a peer); it
// resubscribes and starts from a fresh snapshot. Messages are at most
// MaxMessageBytes, a message at most MaxBatch deltas and a delta at most
// MaxBlocks blocks, all checked before anything is allocated. The sync
// port carries no TLS: it is for the cluster network, like etcd's peer
// port without TLS.
package replica
