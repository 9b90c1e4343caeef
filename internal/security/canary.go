package security

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// canary listens on the host's loopback (TCP on 127.0.0.1 and, when the
// host allows it, 127.0.0.2 on the same port; UDP on 127.0.0.1) and records
// everything that reaches it. Nothing inside a sandbox should ever be able
// to: a hit is host-side proof of a bypass. It answers with the run's token,
// which the sandbox is never told.
type canary struct {
	port, udpPort int
	token         string
	lns           []net.Listener
	pc            net.PacketConn

	mu   sync.Mutex
	hits []string
}

func newCanary(token string) (*canary, error) {
	c := &canary{token: token}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.port = ln.Addr().(*net.TCPAddr).Port
	c.lns = append(c.lns, ln)
	if ln2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", c.port)); err == nil {
		c.lns = append(c.lns, ln2)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		c.close()
		return nil, err
	}
	c.pc, c.udpPort = pc, pc.LocalAddr().(*net.UDPAddr).Port
	for _, l := range c.lns {
		go c.serveTCP(l)
	}
	go c.serveUDP()
	return c, nil
}

func (c *canary) record(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hits) < 20 {
		c.hits = append(c.hits, s)
	}
}

func (c *canary) received() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.hits...)
}

func (c *canary) serveTCP(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 4096)
			n, _ := conn.Read(buf)
			c.record(fmt.Sprintf("tcp %s: %q", ln.Addr(), trunc(buf[:n], 240)))
			body := c.token + "\n"
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		}()
	}
}

func (c *canary) serveUDP() {
	buf := make([]byte, 2048)
	for {
		n, addr, err := c.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		c.record(fmt.Sprintf("udp %s from %s: %q", c.pc.LocalAddr(), addr, trunc(buf[:n], 120)))
		c.pc.WriteTo([]byte(c.token), addr)
	}
}

func (c *canary) close() {
	for _, l := range c.lns {
		l.Close()
	}
	if c.pc != nil {
		c.pc.Close()
	}
}

func trunc(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
