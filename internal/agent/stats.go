package agent

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// cpuTimes is the guest's "cpu" line of /proc/stat, in ticks.
type cpuTimes struct {
	at          time.Time
	busy, total uint64
}

// cpuWindow is how long a Stats call samples when there is no recent
// earlier sample; cpuStale is the age past which an earlier sample no
// longer describes "now".
const (
	cpuWindow = 100 * time.Millisecond
	cpuStale  = time.Minute
)

// cpuMeter computes CPU use between calls, so nothing runs in the
// background of an idle sandbox.
type cpuMeter struct {
	read  func() (cpuTimes, error)
	sleep func(time.Duration)

	mu   sync.Mutex
	last cpuTimes
}

// usedPct is the share of all CPUs busy since the previous call, or over
// cpuWindow when that call is less than cpuWindow or more than cpuStale
// ago (or the counters went back, as after a restore into another sandbox).
func (m *cpuMeter) usedPct() (float64, error) {
	cur, err := m.read()
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	prev := m.last
	m.mu.Unlock()
	if d := cur.at.Sub(prev.at); prev.at.IsZero() || d < cpuWindow || d > cpuStale || cur.total <= prev.total || cur.busy < prev.busy {
		prev = cur
		m.sleep(cpuWindow)
		if cur, err = m.read(); err != nil {
			return 0, err
		}
	}
	m.mu.Lock()
	if cur.at.After(m.last.at) {
		m.last = cur
	}
	m.mu.Unlock()
	if cur.total <= prev.total || cur.busy < prev.busy {
		return 0, nil
	}
	pct := 100 * float64(cur.busy-prev.busy) / float64(cur.total-prev.total)
	return min(pct, 100), nil
}

// readCPUTimes reads /proc/stat's first line: user nice system idle iowait
// irq softirq steal (guest and guest_nice are inside user and nice).
func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPUTimes(string(b), time.Now())
}

func parseCPUTimes(stat string, at time.Time) (cpuTimes, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, errdefs.Newf(errdefs.ErrInternal, "unexpected /proc/stat: %.60q", line)
	}
	t := cpuTimes{at: at}
	for i, s := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, errdefs.Newf(errdefs.ErrInternal, "unexpected /proc/stat: %.60q", line)
		}
		t.total += n
		if i != 3 && i != 4 { // idle, iowait
			t.busy += n
		}
	}
	return t, nil
}

func (a *Agent) handleStats(w http.ResponseWriter, r *http.Request) {
	st := agentproto.Stats{CPUCount: runtime.NumCPU()}
	if r.URL.Query().Get("cpu") != "0" { // cpu=0: not wanted, so not measured (no 100 ms window)
		pct, err := a.cpu.usedPct()
		if err != nil {
			writeError(w, err)
			return
		}
		st.CPUUsedPct = pct
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mi := agentproto.ParseMeminfo(string(b))
		st.MemTotal, st.MemCache = mi["MemTotal"], mi["Cached"]
		st.MemUsed = max(mi["MemTotal"]-mi["MemAvailable"], 0)
	}
	var fs unix.Statfs_t
	if unix.Statfs("/", &fs) == nil {
		bs := int64(fs.Bsize)
		st.DiskTotal = int64(fs.Blocks) * bs
		st.DiskUsed = max(int64(fs.Blocks-fs.Bfree)*bs, 0)
	}
	if s := r.URL.Query().Get("files_over"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			writeError(w, errdefs.InvalidArgument("bad files_over %q", s))
			return
		}
		st.LargeFiles = largeFiles("/", n, maxLargeFiles)
	}
	writeJSON(w, st)
}

// maxLargeFiles bounds the files a Stats call names.
const maxLargeFiles = 8

// largeFiles walks the filesystem of root (not the filesystems mounted
// below it: /proc, /tmp, /dev, the agent's own) for regular files larger
// than over bytes, and returns the first limit of them.
func largeFiles(root string, over int64, limit int) []agentproto.FileSize {
	var rootSt unix.Stat_t
	if unix.Lstat(root, &rootSt) != nil {
		return nil
	}
	var out []agentproto.FileSize
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: skip it
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if d.IsDir() && st.Dev != rootSt.Dev {
			return filepath.SkipDir // another filesystem mounted here
		}
		// (Files are not compared: an overlay's files report the device
		// of the layer they are in.)
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > over {
			out = append(out, agentproto.FileSize{Path: p, Size: st.Size})
			if len(out) >= limit {
				return filepath.SkipAll
			}
		}
		return nil
	})
	return out
}
