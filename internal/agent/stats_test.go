package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseCPUTimes(t *testing.T) {
	at := time.Now()
	got, err := parseCPUTimes("cpu  242 1 21 335 4 5 6 7 8 9\ncpu0 121 0 11 168 0 0 0 0 0 0\n", at)
	if err != nil {
		t.Fatal(err)
	}
	// busy: user nice system irq softirq steal; total adds idle and iowait;
	// guest and guest_nice are already inside user and nice.
	if got.busy != 242+1+21+5+6+7 || got.total != got.busy+335+4 || !got.at.Equal(at) {
		t.Errorf("got %+v", got)
	}
	for _, bad := range []string{"", "intr 1 2\n", "cpu 1 2 x 4 5\n", "cpu 1 2\n"} {
		if _, err := parseCPUTimes(bad, at); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestCPUMeter: use is measured between calls; a first call, one right
// after another, one long after, or counters that went back (a restore)
// measure a window of their own.
func TestCPUMeter(t *testing.T) {
	now := time.Unix(1000, 0)
	var busy, total uint64
	var slept time.Duration
	m := &cpuMeter{
		read: func() (cpuTimes, error) { return cpuTimes{at: now, busy: busy, total: total}, nil },
		sleep: func(d time.Duration) {
			slept += d
			now = now.Add(d)
			busy, total = busy+5, total+20 // 25 % over a window
		},
	}
	check := func(what string, want float64, wantSleep bool) {
		t.Helper()
		slept = 0
		got, err := m.usedPct()
		if err != nil || got != want || (slept > 0) != wantSleep {
			t.Errorf("%s: %.1f %% (slept %v) err %v, want %.1f %% (sleep %v)", what, got, slept, err, want, wantSleep)
		}
	}
	check("first call", 25, true)

	now = now.Add(5 * time.Second)
	busy, total = busy+900, total+1000
	check("5 s later", 90, false)

	now = now.Add(10 * time.Millisecond)
	check("right after", 25, true)

	now = now.Add(2 * time.Minute)
	busy, total = busy+1, total+100000
	check("stale", 25, true)

	now = now.Add(time.Second)
	busy, total = 10, 40 // counters of another sandbox's past
	check("went back", 25, true)

	now = now.Add(time.Second)
	busy, total = busy+300, total+200 // more busy than elapsed: capped
	check("capped", 100, false)
}

// largeFiles names the regular files over the size, sparse ones by their
// logical size, at most limit of them.
func TestLargeFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int64) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil { // sparse
			t.Fatal(err)
		}
	}
	write("small", 10)
	write("a/big", 5000)
	write("a/b/huge", 1<<40)
	if err := os.Symlink(filepath.Join(dir, "a/big"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	got := largeFiles(dir, 100, 8)
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	sizes := map[string]int64{}
	for _, f := range got {
		sizes[strings.TrimPrefix(f.Path, dir)] = f.Size
	}
	if sizes["/a/big"] != 5000 || sizes["/a/b/huge"] != 1<<40 {
		t.Errorf("got %+v", got)
	}
	if got := largeFiles(dir, 100, 1); len(got) != 1 {
		t.Errorf("limit 1: %+v", got)
	}
}
