package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// fakeQMP serves the QMP handshake and answers commands from answers
// (command → raw JSON reply line), emitting an event before each reply.
func fakeQMP(t *testing.T, answers map[string]string) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte(`{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}` + "\n"))
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var req struct {
						Execute   string          `json:"execute"`
						Arguments json.RawMessage `json:"arguments"`
					}
					if json.Unmarshal(sc.Bytes(), &req) != nil {
						return
					}
					got <- req.Execute + string(req.Arguments)
					c.Write([]byte(`{"event": "RESUME", "timestamp": {"seconds": 1}}` + "\n"))
					if req.Execute == "qmp_capabilities" {
						c.Write([]byte(`{"return": {}}` + "\n"))
						continue
					}
					a, ok := answers[req.Execute]
					if !ok {
						a = `{"error": {"class": "CommandNotFound", "desc": "no such command"}}`
					}
					c.Write([]byte(a + "\n"))
				}
			}()
		}
	}()
	return path, got
}

func TestQMP(t *testing.T) {
	path, got := fakeQMP(t, map[string]string{
		"query-status": `{"return": {"status": "paused", "running": false}}`,
		"stop":         `{"return": {}}`,
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if c := <-got; c != "qmp_capabilities" {
		t.Errorf("first command %q", c)
	}
	st, err := q.status(ctx)
	if err != nil || st != "paused" {
		t.Errorf("status = %q, %v", st, err)
	}
	<-got
	if err := q.execute(ctx, "migrate", map[string]any{"uri": "exec:cat > x"}, nil); err == nil {
		t.Error("error answer not reported")
	} else {
		var qe *qmpError
		if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
			t.Errorf("error = %v", err)
		}
	}
	if c := <-got; c != `migrate{"uri":"exec:cat \u003e x"}` {
		t.Errorf("arguments sent: %s", c)
	}
	if err := qmpDo(ctx, path, "stop", nil, nil); err != nil {
		t.Errorf("qmpDo: %v", err)
	}
}

func TestQMPContextCancel(t *testing.T) {
	// A server that greets and then never answers.
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte(`{"QMP": {}}` + "\n"))
			time.Sleep(5 * time.Second)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := dialQMP(ctx, path); err == nil {
		t.Fatal("dial succeeded without capabilities answer")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("cancel took %s", time.Since(start))
	}
}
