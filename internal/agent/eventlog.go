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
// that an event an attached subscriber has not yet taken is never dropped —
// append blocks instead, which stops the pipe pump and so back-pressures the
// process. An attached client therefore receives every byte, while an
// unattached process keeps only its newest output.
type eventLog struct {
	mu     sync.Mutex
	wake   chan struct{} // closed and replaced on every state change
	events []agentproto.Event
	first  uint64 // seq of events[0] (or next when empty)
	next   uint64 // seq the next appended event gets
	bytes  int
	limit  int
	closed bool // the exit event was appended
	subs   map[*subscriber]struct{}
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
func (l *eventLog) append(ev agentproto.Event) {
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
		l.bytes -= evSize(&l.events[0])
		l.events[0] = agentproto.Event{} // release Data
		l.events = l.events[1:]
		l.first++
	}
	ev.Seq = l.next
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	l.next++
	l.events = append(l.events, ev)
	l.bytes += size
	if ev.Type == agentproto.EventExit {
		l.closed = true
	}
	l.broadcastLocked()
	l.mu.Unlock()
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
		l.bytes -= evSize(&l.events[0])
		l.events[0] = agentproto.Event{}
		l.events = l.events[1:]
		l.first++
		dropped = true
	}
	if dropped {
		l.events = slices.Clip(l.events) // let append reallocate, releasing the old array
		l.broadcastLocked()
	}
}

// neededLocked reports whether some subscriber has not yet taken seq.
func (l *eventLog) neededLocked(seq uint64) bool {
	for s := range l.subs {
		if s.cursor <= seq {
			return true
		}
	}
	return false
}

// subscriber is a cursor into an eventLog. It must be closed.
type subscriber struct {
	log    *eventLog
	cursor uint64 // next seq to deliver
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
func (s *subscriber) next(ctx context.Context, follow bool, buf []agentproto.Event) (batch []agentproto.Event, last bool, err error) {
	if s.done {
		return nil, true, nil
	}
	l := s.log
	l.mu.Lock()
	for {
		batch = buf[:0]
		if s.cursor < l.first {
			batch = append(batch, agentproto.Event{Seq: l.first, Type: agentproto.EventTruncated, Time: time.Now()})
			s.cursor = l.first
		}
		if s.cursor < l.next {
			i := int(s.cursor - l.first)
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
