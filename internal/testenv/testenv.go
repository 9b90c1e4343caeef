// Package testenv gives tests the real pieces they run sandboxes with: the
// pinned runsc build, the space-agent binary and the built `base` template.
// Nothing here is faked: when a piece is missing the test fails and says how
// to get it (`make test` provides all of them).
package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/template"
)

// CacheDir is the shared cache of gVisor and template builds.
func CacheDir() string {
	if d := os.Getenv("SPACE_CACHE"); d != "" {
		return d
	}
	return "/var/cache/space"
}

// Runsc returns the path of the pinned runsc build.
func Runsc(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SPACE_RUNSC")
	if p == "" {
		p = filepath.Join(CacheDir(), "runsc-"+gvisor.BuildName(), "runsc")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("runsc not found at %s: run `make runsc` (or `make test`, which builds it): %v", p, err)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("sandbox tests run runsc and must run as root")
	}
	return p
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// Agent returns the path of a static space-agent binary: $SPACE_AGENT, or
// one built once per test process.
func Agent(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SPACE_AGENT"); p != "" {
		return p
	}
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "space-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentPath = filepath.Join(dir, "space-agent")
		cmd := exec.Command("go", "build", "-o", agentPath, "github.com/spacesandbox/space/cmd/space-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			agentErr = &buildError{err: err, out: string(out)}
		}
	})
	if agentErr != nil {
		t.Fatalf("build space-agent: %v", agentErr)
	}
	return agentPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// Base returns the built `base` template, building it into the shared cache
// on first use (minutes; later runs hit the cache).
func Base(t testing.TB) template.Template {
	t.Helper()
	b, err := template.NewBuilder(filepath.Join(CacheDir(), "templates"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tpl, err := b.Build(ctx, template.Base(), func(line string) { t.Log("template:", line) })
	if err != nil {
		t.Fatalf("build base template: %v", err)
	}
	return tpl
}

// RepoRoot returns the checkout's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
