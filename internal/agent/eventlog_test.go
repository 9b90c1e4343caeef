package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
)

func data(n int) agentproto.Event {
	return agentproto.Event{Type: agentproto.EventStdout, Data: make([]byte, n)}
}

func TestEventLogDropsOldestWithoutSubscribers(t *testing.T) {
	l := newEventLog(1000)
	for range 100 {
		l.append(data(100))
	}
	if l.bytes > 1000 || l.first == 1 || l.next != 101 {
		t.Fatalf("bytes %d first %d next %d", l.bytes, l.first, l.next)
	}
	s := l.subscribe(1)
	defer s.close()
	batch, last, err := s.next(context.Background(), false, nil)
	if err != nil || !last {
		t.Fatalf("last %v err %v", last, err)
	}
	if batch[0].Type != agentproto.EventTruncated || batch[0].Seq != l.first || batch[1].Seq != l.first {
		t.Fatalf("batch starts %+v %+v", batch[0], batch[1])
	}
	if got := batch[len(batch)-1].Seq; got != 100 {
		t.Fatalf("last seq %d", got)
	}
}

func TestEventLogBackpressure(t *testing.T) {
	l := newEventLog(1000)
	s := l.subscribe(1)
	appended := make(chan uint64, 100)
	go func() {
		for range 50 {
			l.append(data(100))
			appended <- 1
		}
		l.append(agentproto.Event{Type: agentproto.EventExit})
		close(appended)
	}()
	// The writer stalls once the log is full of events s has not taken.
	time.Sleep(50 * time.Millisecond)
	if n := len(appended); n > 7 {
		t.Fatalf("%d appends went through a full log", n)
	}
	var seqs []uint64
	for {
		batch, last, err := s.next(context.Background(), true, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch {
			if ev.Type == agentproto.EventTruncated {
				t.Fatal("subscriber lost events")
			}
			seqs = append(seqs, ev.Seq)
		}
		if last {
			break
		}
	}
	for i, seq := range seqs {
		if seq != uint64(i+1) {
			t.Fatalf("seq %d at %d", seq, i)
		}
	}
	if len(seqs) != 51 {
		t.Fatalf("%d events", len(seqs))
	}
	// A subscriber leaving releases the writer.
	l2 := newEventLog(200)
	s2 := l2.subscribe(1)
	done := make(chan struct{})
	go func() {
		for range 10 {
			l2.append(data(100))
		}
		close(done)
	}()
	time.Sleep(20 * time.Millisecond)
	s2.close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writer still blocked after the subscriber left")
	}
}

// A long stream reuses the chunks of events it has dropped, but never one
// a subscriber is still writing; an exited process's short output is
// copied out of its chunk.
func TestEventLogRecyclesChunks(t *testing.T) {
	const size = readChunkMin
	l := newEventLog(2 * (size + eventOverhead))
	chunks := map[*chunk]bool{}
	appendRead := func(fill byte) []byte {
		c := l.newChunk(size)
		chunks[c] = true
		for i := range c.buf {
			c.buf[i] = fill
		}
		l.appendIn(agentproto.Event{Type: agentproto.EventStdout, Data: c.buf}, c)
		l.doneWith(c)
		return c.buf
	}
	for range 10 {
		appendRead(1)
	}
	if len(chunks) > 2+maxFree {
		t.Fatalf("10 reads through a 2-event log used %d chunks", len(chunks))
	}

	s := l.subscribe(l.next)
	defer s.close()
	held := appendRead(7)
	batch, _, err := s.next(context.Background(), true, nil)
	if err != nil || len(batch) != 1 || &batch[0].Data[0] != &held[0] {
		t.Fatalf("batch %d events, err %v", len(batch), err)
	}
	// A later event, then a trim by the retention rule appends use: the
	// held event stays, and its chunk is not offered for reuse.
	heldSeq := batch[0].Seq
	appendRead(9)
	l.trim(0)
	l.mu.Lock()
	kept := l.first == heldSeq
	reusable := slices.ContainsFunc(l.free, func(c *chunk) bool { return &c.buf[0] == &held[0] })
	l.mu.Unlock()
	if !kept || reusable {
		t.Fatalf("the log dropped an event its subscriber was still writing (kept %v, chunk reusable %v)", kept, reusable)
	}
	for _, c := range held {
		if c != 7 {
			t.Fatal("a held event's chunk was reused")
		}
	}
	// Asking for more releases the batch: now it can go, chunk and all.
	if _, _, err := s.next(context.Background(), false, nil); err != nil {
		t.Fatal(err)
	}
	l.trim(0)
	l.mu.Lock()
	kept = l.first == heldSeq
	reusable = slices.ContainsFunc(l.free, func(c *chunk) bool { return &c.buf[0] == &held[0] })
	l.mu.Unlock()
	if kept || !reusable {
		t.Fatalf("a released event was kept (%v) or its chunk not reused (%v)", kept, !reusable)
	}

	// Exit: a short output no longer pins its chunk.
	l2 := newEventLog(1 << 20)
	c := l2.newChunk(size)
	copy(c.buf, "hi\n")
	l2.appendIn(agentproto.Event{Type: agentproto.EventStdout, Data: c.buf[:3:3]}, c)
	l2.doneWith(c)
	l2.append(agentproto.Event{Type: agentproto.EventExit})
	if d := l2.events[0].Data; string(d) != "hi\n" || cap(d) != 3 || l2.chunks[0] != nil {
		t.Fatalf("after exit: %q (cap %d), chunk %v", d, cap(d), l2.chunks[0])
	}
}

func TestEventLogTrim(t *testing.T) {
	l := newEventLog(1 << 20)
	for range 10 {
		l.append(data(1000))
	}
	// A subscriber that has taken nothing yet holds everything.
	s := l.subscribe(1)
	l.trim(0)
	if l.first != 1 || l.size() != 10*evSize(&l.events[0]) {
		t.Fatalf("trimmed under a subscriber: first %d bytes %d", l.first, l.size())
	}
	s.close()
	l.append(agentproto.Event{Type: agentproto.EventExit})
	exit := l.events[len(l.events)-1]
	l.trim(3 * evSize(&l.events[0]))
	if l.size() > 3*(1000+eventOverhead) || l.first != 9 {
		t.Fatalf("trim to 3 events: bytes %d first %d", l.size(), l.first)
	}
	// Trimming to nothing keeps the exit, after a truncated event.
	l.trim(0)
	if len(l.events) != 1 || l.events[0].Seq != exit.Seq || l.events[0].Type != agentproto.EventExit {
		t.Fatalf("trim to 0 kept %+v", l.events)
	}
	s = l.subscribe(1)
	defer s.close()
	batch, last, err := s.next(context.Background(), false, nil)
	if err != nil || !last || len(batch) != 2 || batch[0].Type != agentproto.EventTruncated || batch[1].Type != agentproto.EventExit {
		t.Fatalf("read after trim: %+v last %v err %v", batch, last, err)
	}
}

func TestResolve(t *testing.T) {
	a := &Agent{opts: Options{Home: "/home/user"}}
	for in, want := range map[string]string{
		"f":            "/home/user/f",
		"a//b/./c/":    "/home/user/a/b/c",
		"/tmp/x":       "/tmp/x",
		"/":            "/",
		"...":          "/home/user/...",
		"..foo/x":      "/home/user/..foo/x",
		"/a/b/../../c": "",
		"..":           "",
		"a\x00":        "",
		"":             "",
	} {
		got, err := a.resolve(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"SIGTERM": 15, "term": 15, "9": 9, "KILL": 9, "sigint": 2, "BOGUS": 0, "0": 0} {
		got, err := parseSignal(in)
		if (err != nil) != (want == 0) || int(got) != want {
			t.Errorf("parseSignal(%q) = %d, %v", in, got, err)
		}
	}
}

// A smaller limit trims the log at once, keeping what a subscriber has not
// taken; a larger one lets a blocked append through.
func TestEventLogSetLimit(t *testing.T) {
	l := newEventLog(10000)
	for range 50 {
		l.append(data(100))
	}
	l.setLimit(1000)
	if l.bytes > 1000 || l.next != 51 || l.events[len(l.events)-1].Seq != 50 {
		t.Fatalf("after shrink: bytes %d next %d", l.bytes, l.next)
	}
	s := l.subscribe(l.first)
	defer s.close()
	first := l.first
	l.setLimit(300)
	if l.first != first {
		t.Fatalf("trimmed events a subscriber still needs: first %d → %d", first, l.first)
	}
	done := make(chan struct{})
	go func() {
		l.append(data(100)) // the log is over its limit with needed events: blocks
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("append went through a full log")
	case <-time.After(20 * time.Millisecond):
	}
	l.setLimit(100000)
	<-done
	if l.next != 52 {
		t.Fatalf("next %d", l.next)
	}
	if got := l.chunkMax(); got != 100000/4 {
		t.Fatalf("chunk max %d", got)
	}
	l.setLimit(1000)
	if got := l.chunkMax(); got != 4<<10 {
		t.Fatalf("chunk max of a small log %d", got)
	}
}

func TestParseMemTotal(t *testing.T) {
	for in, want := range map[string]int64{
		"MemTotal:         524288 kB\nMemFree:          509456 kB\n": 512 << 20,
		"MemFree: 1 kB\nMemTotal: 1024 kB\n":                         1 << 20,
		"MemTotal: 12 MB\n":                                          0,
		"MemTotal: -5 kB\n":                                          0,
		"":                                                           0,
	} {
		if got := parseMemTotal([]byte(in)); got != want {
			t.Errorf("parseMemTotal(%q) = %d, want %d", in, got, want)
		}
	}
}
