//go:build unix

package zmtp

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// BenchmarkPubSub streams 2 KiB KV-event-sized messages (topic, 8-byte
// sequence, payload) from a PUB to a SUB over loopback, on go-zeromq's
// plain tcp transport and through the guard on both ends. Time runs from
// the first Send until the SUB has received the last message; cpu-ns/op is
// the process's CPU time (user and system) per message, which the load of
// other processes on the machine disturbs much less than the wall time.
func BenchmarkPubSub(b *testing.B) {
	for _, c := range []struct {
		name string
		ep   func(string) string
	}{
		{"tcp", func(ep string) string { return ep }},
		{"zmtp", Endpoint},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pub := zmq4.NewPub(ctx)
			defer pub.Close()
			if err := pub.Listen(c.ep("tcp://127.0.0.1:0")); err != nil {
				b.Fatal(err)
			}
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			if err := sub.Dial(c.ep("tcp://" + pub.Addr().String())); err != nil {
				b.Fatal(err)
			}
			if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				b.Fatal(err)
			}
			subscribed(b, pub)
			msg := zmq4.NewMsgFrom([]byte("kv@w1@m"), seq(1), payload(1, 2048))
			b.SetBytes(int64(len("kv@w1@m") + 8 + 2048))
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			b.ResetTimer()
			received := async(func() error {
				for range b.N {
					if _, err := sub.Recv(); err != nil {
						return err
					}
				}
				return nil
			})
			for range b.N {
				if err := pub.Send(msg); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-received; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkStream is the guard's own cost per message, without I/O: the
// stream fed a 2 KiB three-frame message in the pieces go-zeromq reads
// (each frame's 2-byte header, then its body).
func BenchmarkStream(b *testing.B) {
	msg := message([]byte("kv@w1@m"), seq(1), payload(1, 2048))
	s := stream{maxMsg: DefaultMaxMessageBytes}
	if _, err := feedAll(b, &s, cat(greeting("NULL"), ready("PUB")), 1<<20); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		for p := msg; len(p) > 0; {
			n := s.room(len(p))
			if err := s.feed(p[:n]); err != nil {
				b.Fatal(err)
			}
			p = p[n:]
		}
	}
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
