package agentproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"
)

func TestEventFramesRoundTrip(t *testing.T) {
	code := 3
	now := time.Unix(0, time.Now().UnixNano())
	evs := []Event{
		{Seq: 1, Type: EventStart, Time: now, PID: 42},
		{Seq: 2, Type: EventStdout, Time: now, Data: []byte("hello\x00\xff binary")},
		{Seq: 3, Type: EventStderr, Time: now, Data: bytes.Repeat([]byte("e"), 70000)},
		{Seq: 4, Type: EventExit, Time: now, ExitCode: &code, Signal: "SIGTERM", Error: "x"},
	}
	var buf bytes.Buffer
	for i := range evs {
		if err := WriteEventFrame(&buf, &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	whole := buf.Bytes()
	r := bufio.NewReader(bytes.NewReader(whole))
	for i := range evs {
		got, err := ReadEventFrame(r)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Time.Equal(evs[i].Time) {
			t.Fatalf("event %d time %v, want %v", i, got.Time, evs[i].Time)
		}
		got.Time = evs[i].Time
		if !reflect.DeepEqual(got, evs[i]) {
			t.Fatalf("event %d = %+v, want %+v", i, got, evs[i])
		}
	}
	if _, err := ReadEventFrame(r); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
	// A stream cut inside a frame is not a clean end.
	r = bufio.NewReader(bytes.NewReader(whole[:len(whole)-5]))
	var err error
	for err == nil {
		_, err = ReadEventFrame(r)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut stream: %v", err)
	}
	// A frame claiming an absurd length is refused before allocating.
	bad := make([]byte, frameHeader)
	bad[0], bad[17] = frameStdout, 0xff
	if _, err := ReadEventFrame(bufio.NewReader(bytes.NewReader(bad))); err == nil {
		t.Fatal("oversized frame accepted")
	}
}
