package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// runscProcs returns the pids of runsc processes whose command line names
// the data dir (every runsc the server starts gets --root under it).
func runscProcs(data string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.HasPrefix(filepath.Base(argv0), "runsc") && strings.Contains(cl, data) {
			out = append(out, pid)
		}
	}
	return out
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}
