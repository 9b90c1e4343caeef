package agent

import (
	"bytes"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Output chunks stay within a quarter of what the event log keeps, so the
// newest output (here the final "END") is never dropped with an event too
// big to retain; with room, reads grow past the 64 KiB they start at.
func TestPumpChunksFitTheLog(t *testing.T) {
	for _, limit := range []int{256 << 10, 8 << 20} {
		r, wfd, err := pipe(0, pipeSize)
		if err != nil {
			t.Fatal(err)
		}
		w := os.NewFile(uintptr(wfd), "|1")
		payload := append(bytes.Repeat([]byte{'x'}, 900<<10), "END\n"...)
		if rc, err := w.SyscallConn(); err == nil {
			var sz int
			rc.Control(func(fd uintptr) { sz, _ = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) })
			if sz < len(payload) {
				t.Skipf("pipe holds %d bytes here", sz)
			}
		}
		if _, err := w.Write(payload); err != nil {
			t.Fatal(err)
		}
		w.Close()
		log := newEventLog(limit)
		pump(r, "stdout", log)
		r.Close()
		var kept []byte
		largest := 0
		for _, ev := range log.events {
			largest = max(largest, len(ev.Data))
			kept = append(kept, ev.Data...)
		}
		if largest > limit/4 {
			t.Errorf("limit %d: an event of %d bytes (more than a quarter of the log)", limit, largest)
		}
		if !bytes.HasSuffix(kept, []byte("END\n")) {
			t.Errorf("limit %d: the final output was not kept", limit)
		}
		if limit == 8<<20 && largest <= readChunkMin {
			t.Errorf("limit %d: reads never grew past %d bytes", limit, largest)
		}
	}
}

// Output already in the pipe when the exit grace has passed is still read
// (a grandchild holds the pipe open, and the agent was too busy to read
// before the deadline): the drain used to stop at the expired deadline, so
// a loaded agent reported `echo ok` with no output.
func TestPumpDrainsAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // held open, as by a background grandchild
	if _, err := w.Write([]byte("ok\n")); err != nil {
		t.Fatal(err)
	}
	_ = r.SetReadDeadline(time.Now().Add(-time.Second)) // the grace is over before the pump runs
	log := newEventLog(1 << 20)
	done := make(chan struct{})
	go func() { pump(r, "stdout", log); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump did not return after its deadline")
	}
	var kept []byte
	for _, ev := range log.events {
		kept = append(kept, ev.Data...)
	}
	if string(kept) != "ok\n" {
		t.Errorf("output after the deadline: %q, want \"ok\\n\"", kept)
	}
}
