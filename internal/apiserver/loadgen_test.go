package apiserver

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/url"
	"sync"

	"github.com/prefixd/prefixd/internal/testsupport/openloop"
)

// The HTTP/1.1 sender of BenchmarkQuery8KExternal's load generator
// (package openloop paces it).

var _ openloop.SplitSender = (*rawSender)(nil)

// rawSender sends over one keep-alive HTTP/1.1 connection of its own:
// the request, headers and body prepared once, in one Write, and the
// response read through its Content-Length, which must be there (the API
// never chunks a query's answer) and at least 100 bytes, after a 200
// status line. It allocates nothing per request, and as a openloop.SplitSender
// its requests are written by openloop.Run's pacer at their due time, where
// net/http's client hands each request to two goroutines of the
// connection and allocates its Request, Response and headers: on a
// 2-core machine whatever the generator spends is taken from the server
// it measures. Through send, a connection that fails or that the server
// closes is dialled again by the next send; under pacedWrites such a
// sender retires.
type rawSender struct {
	addr string
	req  []byte
	conn net.Conn // set by dial (send's goroutine), cleared by close
	r    *bufio.Reader
	mu   sync.Mutex // serialises close
}

// newRawSender returns a sender of POST requests of body to rawURL
// (http://host:port/path), its connection dialled.
func newRawSender(rawURL string, body []byte) (*rawSender, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("loadgen: %s: not http://", rawURL)
	}
	req := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		u.RequestURI(), u.Host, len(body))
	s := &rawSender{addr: u.Host, req: append(req, body...)}
	return s, s.dial()
}

func (s *rawSender) dial() error {
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		return err
	}
	s.conn = c
	if s.r == nil {
		s.r = bufio.NewReaderSize(c, 32<<10)
	} else {
		s.r.Reset(c)
	}
	return nil
}

func (s *rawSender) Send() error {
	if s.conn == nil {
		if err := s.dial(); err != nil {
			return err
		}
	}
	keep, err := s.exchange()
	if err != nil || !keep {
		s.Close()
	}
	return err
}

var (
	status200     = []byte("HTTP/1.1 200 ")
	contentLength = []byte("Content-Length")
	connection    = []byte("Connection")
)

// exchange writes the request and reads the response; keep reports
// whether the connection may carry another.
func (s *rawSender) exchange() (keep bool, err error) {
	if err := s.Write(); err != nil {
		return false, err
	}
	return s.Read()
}

// write writes the request.
func (s *rawSender) Write() error {
	_, err := s.conn.Write(s.req)
	return err
}

// read reads a response; keep reports whether the connection may carry
// another.
func (s *rawSender) Read() (keep bool, err error) {
	line, err := s.r.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	if !bytes.HasPrefix(line, status200) {
		return false, fmt.Errorf("status line %.40q", line)
	}
	n, keep := -1, true
	for {
		line, err := s.r.ReadSlice('\n')
		if err != nil {
			return false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		k, v, _ := bytes.Cut(line, []byte{':'})
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, contentLength):
			n = 0
			for _, c := range v {
				if c < '0' || c > '9' || n > 1<<30 {
					return false, fmt.Errorf("Content-Length %.40q", v)
				}
				n = n*10 + int(c-'0')
			}
		case bytes.EqualFold(k, connection):
			keep = !bytes.EqualFold(v, []byte("close"))
		}
	}
	if n < 100 {
		return false, fmt.Errorf("Content-Length %d: want at least 100 bytes", n)
	}
	if _, err := s.r.Discard(n); err != nil {
		return false, err
	}
	return keep, nil
}

func (s *rawSender) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}
