package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	every := flag.Duration("every", 20*time.Second, "how often to print the packages still running")
	flag.Parse()
	if flag.NArg() != 0 || *every <= 0 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ./... | testprogress [-every 20s]")
		os.Exit(2)
	}
	if !run(os.Stdin, os.Stdout, *every) {
		os.Exit(1)
	}
}

// run reports the events read from in to out until the end of in, with a
// progress line every period; it returns whether everything passed.
func run(in io.Reader, out io.Writer, every time.Duration) bool {
	r := newReporter(out, time.Now())
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		// The reader owns sc; each line is a fresh copy, so the loop below
		// may keep it.
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
		readErr <- sc.Err()
	}()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case b, ok := <-lines:
			if !ok {
				err := <-readErr
				if err != nil {
					fmt.Fprintf(out, "testprogress: reading the input: %v\n", err)
				}
				return r.finish(time.Now()) && err == nil
			}
			r.line(b, time.Now())
		case now := <-ticker.C:
			r.tick(now)
		}
	}
}
