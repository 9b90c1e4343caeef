// Command impostor is what root inside a sandbox can do to the host over
// the agent socket (issue 34): freeze the real agent (SIGSTOP to PID 1),
// connect to /.space/run/agent.sock in its place and answer every request
// with an endless JSON value. Built by the e2e tests, run as root inside
// a sandbox; what it saw goes to stdout, one line per connection.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

func main() {
	sock := flag.String("sock", "/.space/run/agent.sock", "the agent socket")
	stop := flag.Bool("stop", true, "SIGSTOP the real agent (PID 1) for the run, SIGCONT it after")
	run := flag.Duration("for", 15*time.Second, "how long to keep trying")
	flood := flag.Int64("flood", 600<<20, "bytes of JSON to send per answer")
	delay := flag.Duration("delay", time.Second, "wait before starting (the exec that started us must return)")
	flag.Parse()
	time.Sleep(*delay)
	if *stop {
		syscall.Kill(1, syscall.SIGSTOP)
		defer syscall.Kill(1, syscall.SIGCONT)
	}
	chunk := []byte(strings.Repeat("a", 64<<10))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("request %s %s\n", r.Method, r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `[{"pid":1,"cmd":["`)
		for sent := int64(0); sent < *flood; sent += int64(len(chunk)) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		io.WriteString(w, `"]}]`)
	})
	end := time.Now().Add(*run)
	for n := 0; time.Now().Before(end); n++ {
		c, err := net.Dial("unix", *sock)
		if err != nil {
			fmt.Printf("conn %d: dial: %v\n", n, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		// A host that authenticates speaks first: answer its challenge
		// with a made-up MAC. A host that does not hears yamux at once.
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		var first [19]byte
		k, _ := io.ReadFull(c, first[:])
		c.SetReadDeadline(time.Time{})
		if k > 0 && bytes.HasPrefix(first[:k], []byte("SPACE-AGENT-AUTH/")) {
			io.CopyN(io.Discard, c, 65) // the rest of the challenge line
			io.WriteString(c, "SPACE-AGENT-AUTH/1 "+strings.Repeat("0", 64)+"\n")
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err := c.Read(first[:])
			fmt.Printf("conn %d: challenged; after a wrong answer: %v\n", n, err)
			c.Close()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		fmt.Printf("conn %d: no challenge; serving the agent protocol\n", n)
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		// Bytes read while waiting for a challenge were yamux.
		sess, err := yamux.Server(&prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(first[:k]), c)}, cfg)
		if err != nil {
			c.Close()
			continue
		}
		srv := &http.Server{Handler: handler}
		go srv.Serve(sess)
		select {
		case <-sess.CloseChan():
			fmt.Printf("conn %d: the host closed the session\n", n)
		case <-time.After(time.Until(end)):
		}
	}
	fmt.Println("done")
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }
