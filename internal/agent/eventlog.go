package agent

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
)

// eventOverhead is what one buffered event costs on top of its data, so a
// stream of tiny reads is bounded too.
const eventOverhead = 64

// eventLog is the retained output of one process.
//
// Retention: up to limit bytes are kept; older events are dropped, except
// that an event an attached subscriber has not yet taken (or is still
// writing) is never dropped —
// append blocks instead, which stops the pipe pump and so back-pressures the
// process. An attached client therefore receives every byte, while an
// unattached process keeps only its newest output.
type eventLog struct {
	mu     sync.Mutex
	wake   chan struct{} // closed and replaced on every state change
	events []agentproto.Event
	chunks []*chunk // chunks[i] holds events[i].Data (nil: data of its own)
	first  uint64   // seq of events[0] (or next when empty)
	next   uint64   // seq the next appended event gets
	bytes  int
	limit  int
	closed bool // the exit event was appended
	subs   map[*subscriber]struct{}
	free   []*chunk // chunks no event uses any more, for the pump to reuse
}

// chunk is a read buffer that successive reads of one output stream fill
// in turn, each read's event being a slice of it. Inside gVisor every
// fresh page is a fault the sentry handles (a reader taking a new buffer
// per read moved half as much as one reusing its buffer), so a stream
// reads into the rest of its chunk, and a long stream reuses the chunks of
// the events it has already passed on and dropped.
type chunk struct {
	buf  []byte
	refs int // retained events in buf, plus one while the pump fills it
}

// maxFree bounds the chunks one log keeps for reuse.
const maxFree = 2

// newChunk returns a chunk of size bytes that the caller fills (and
// releases with doneWith): a recycled one when one of that size is free.
// A pump's chunk size only grows, so smaller free chunks are forgotten.
func (l *eventLog) newChunk(size int) *chunk {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *chunk
	l.free = slices.DeleteFunc(l.free, func(c *chunk) bool {
		if found == nil && len(c.buf) == size {
			found = c
			return true
		}
		return len(c.buf) < size
	})
	if found == nil {
		return &chunk{buf: make([]byte, size), refs: 1}
	}
	found.refs = 1
	return found
}

// doneWith releases the filler's hold on c (nil is ignored).
func (l *eventLog) doneWith(c *chunk) {
	l.mu.Lock()
	l.releaseLocked(c)
	l.mu.Unlock()
}

func (l *eventLog) releaseLocked(c *chunk) {
	if c == nil {
		return
	}
	if c.refs--; c.refs == 0 && !l.closed && len(l.free) < maxFree {
		l.free = append(l.free, c)
	}
}

func newEventLog(limit int) *eventLog {
	return &eventLog{wake: make(chan struct{}), first: 1, next: 1, limit: limit, subs: map[*subscriber]struct{}{}}
}

func (l *eventLog) broadcastLocked() {
	close(l.wake)
	l.wake = make(chan struct{})
}

func evSize(ev *agentproto.Event) int { return len(ev.Data) + eventOverhead }

// append adds ev (its Seq and Time are assigned here). It blocks while the
// log is full of events some subscriber still needs.
func (l *eventLog) append(ev agentproto.Event) { l.appendIn(ev, nil) }

// appendIn is append for an event whose data is a slice of c.
func (l *eventLog) appendIn(ev agentproto.Event, c *chunk) {
	size := evSize(&ev)
	l.mu.Lock()
	for len(l.events) > 0 && l.bytes+size > l.limit {
		if l.neededLocked(l.events[0].Seq) {
			w := l.wake
			l.mu.Unlock()
			<-w
			l.mu.Lock()
			continue
		}
		l.dropFirstLocked()
	}
	ev.Seq = l.next
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	l.next++
	l.events = append(l.events, ev)
	l.chunks = append(l.chunks, c)
	if c != nil {
		c.refs++
	}
	l.bytes += size
	if ev.Type == agentproto.EventExit {
		l.closed = true
		l.free = nil
		l.packLocked()
	}
	l.broadcastLocked()
	l.mu.Unlock()
}

func (l *eventLog) dropFirstLocked() {
	l.bytes -= evSize(&l.events[0])
	l.releaseLocked(l.chunks[0])
	l.events[0], l.chunks[0] = agentproto.Event{}, nil // release Data
	l.events, l.chunks = l.events[1:], l.chunks[1:]
	l.first++
}

// packLocked copies an exited process's retained output out of its chunks
// when they hold much more memory than the output (a short output pins a
// whole chunk), so an exited process keeps memory in proportion to what
// it retains. Events already handed to a subscriber keep the old memory.
func (l *eventLog) packLocked() {
	data, pinned := 0, 0
	seen := map[*chunk]bool{}
	for i, c := range l.chunks {
		if c != nil {
			data += len(l.events[i].Data)
			if !seen[c] {
				seen[c] = true
				pinned += len(c.buf)
			}
		}
	}
	if pinned <= 2*data {
		return
	}
	packed := make([]byte, 0, data)
	for i, c := range l.chunks {
		if c != nil {
			start := len(packed)
			packed = append(packed, l.events[i].Data...)
			l.events[i].Data = packed[start:len(packed):len(packed)]
			l.releaseLocked(c)
			l.chunks[i] = nil
		}
	}
}

// chunkMax is the largest chunk a pump of this log reads into: at most a
// quarter of what the log retains, so the newest output (a final line)
// never sits in one event too big to keep.
func (l *eventLog) chunkMax() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chunkMaxLocked()
}

func (l *eventLog) chunkMaxLocked() int { return min(readChunkMax, max(4<<10, l.limit/4)) }

// setLimit changes what the log retains (a running process's share of the
// agent's budget) and trims it to the new limit as trim does. Free chunks
// larger than the new chunk size are forgotten.
func (l *eventLog) setLimit(limit int) {
	l.mu.Lock()
	if l.limit == limit {
		l.mu.Unlock()
		return
	}
	l.limit = limit
	maxChunk := l.chunkMaxLocked()
	l.free = slices.DeleteFunc(l.free, func(c *chunk) bool { return len(c.buf) > maxChunk })
	l.broadcastLocked() // an append waiting for room may now fit
	l.mu.Unlock()
	l.trim(limit)
}

// size returns the bytes the log retains.
func (l *eventLog) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}

// trim drops the oldest events until the log retains at most max bytes,
// keeping the newest event (an exited process's exit) and every event an
// attached subscriber has not yet taken. A later reader gets a truncated
// event in their place, as when output outgrows the limit.
func (l *eventLog) trim(max int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dropped := false
	for len(l.events) > 1 && l.bytes > max && !l.neededLocked(l.events[0].Seq) {
		l.dropFirstLocked()
		dropped = true
	}
	if dropped {
		l.broadcastLocked()
	}
}

// neededLocked reports whether some subscriber has not yet taken seq.
func (l *eventLog) neededLocked(seq uint64) bool {
	for s := range l.subs {
		if s.cursor <= seq || (s.held != 0 && s.held <= seq) {
			return true
		}
	}
	return false
}

// subscriber is a cursor into an eventLog. It must be closed.
type subscriber struct {
	log    *eventLog
	cursor uint64 // next seq to deliver
	held   uint64 // first seq of the batch the caller is still writing (0: none)
	done   bool
}

// subscribe starts reading at seq from (events before the first retained
// one are reported by a truncated event).
func (l *eventLog) subscribe(from uint64) *subscriber {
	if from == 0 {
		from = 1
	}
	s := &subscriber{log: l, cursor: from}
	l.mu.Lock()
	l.subs[s] = struct{}{}
	l.mu.Unlock()
	return s
}

func (s *subscriber) close() {
	l := s.log
	l.mu.Lock()
	if _, ok := l.subs[s]; ok {
		delete(l.subs, s)
		l.broadcastLocked()
	}
	l.mu.Unlock()
}

const (
	maxBatchEvents = 128
	maxBatchBytes  = 1 << 20
)

// next returns the next batch of events. With follow it waits for new
// events until ctx ends; last is true when the batch ends the stream (the
// exit event was delivered, or, without follow, the buffer was drained).
// The batch's events stay in the log, and their data unchanged, until the
// next call or close: the log may reuse a dropped event's buffer.
func (s *subscriber) next(ctx context.Context, follow bool, buf []agentproto.Event) (batch []agentproto.Event, last bool, err error) {
	if s.done {
		return nil, true, nil
	}
	l := s.log
	l.mu.Lock()
	if s.held != 0 { // the caller is done with the previous batch
		s.held = 0
		l.broadcastLocked()
	}
	for {
		batch = buf[:0]
		if s.cursor < l.first {
			batch = append(batch, agentproto.Event{Seq: l.first, Type: agentproto.EventTruncated, Time: time.Now()})
			s.cursor = l.first
		}
		if s.cursor < l.next {
			i := int(s.cursor - l.first)
			s.held = s.cursor // its data may be recycled only once it is written
			size := 0
			for ; i < len(l.events) && len(batch) < maxBatchEvents && size < maxBatchBytes; i++ {
				batch = append(batch, l.events[i])
				size += len(l.events[i].Data)
			}
			s.cursor = l.first + uint64(i)
			l.broadcastLocked()
		}
		if len(batch) > 0 {
			if l.closed && s.cursor >= l.next {
				s.done = true
			} else if !follow && s.cursor >= l.next {
				s.done = true
			}
			l.mu.Unlock()
			return batch, s.done, nil
		}
		if l.closed || !follow {
			s.done = true
			l.mu.Unlock()
			return nil, true, nil
		}
		w := l.wake
		l.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return nil, true, ctx.Err()
		}
		l.mu.Lock()
	}
}
