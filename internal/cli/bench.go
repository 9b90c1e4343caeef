package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

func (a *app) benchCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Load generators (see also `make bench`)"}
	var concurrency, cycles int
	var checkData string
	load := &cobra.Command{
		Use:   "load",
		Short: "Churn: create → exec → destroy cycles at a given concurrency",
		Long: "Runs --cycles create→exec `true`→destroy cycles with --concurrency workers, prints\n" +
			"cycles per second and latency percentiles, and with --check-leaks DIR (the server's\n" +
			"data dir, on this host) checks that no sandbox process, mount, cgroup or state dir\n" +
			"is left behind. Exits 1 on any error or leak.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			if concurrency < 1 || cycles < 1 {
				return fmt.Errorf("--concurrency and --cycles must be positive")
			}
			return a.churn(cmd.Context(), c, concurrency, cycles, checkData)
		},
	}
	load.Flags().IntVar(&concurrency, "concurrency", 20, "parallel workers")
	load.Flags().IntVar(&cycles, "cycles", 2000, "create→exec→destroy cycles in all")
	load.Flags().StringVar(&checkData, "check-leaks", "", "server data dir to check for leftovers afterwards")
	cmd.AddCommand(load)
	return cmd
}

func (a *app) churn(ctx context.Context, c *space.Client, concurrency, cycles int, dataDir string) error {
	var next, failed atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cycles) && ctx.Err() == nil {
				t0 := time.Now()
				err := func() error {
					sb, err := c.CreateSandbox(ctx, space.CreateSandboxRequest{TimeoutS: 120})
					if err != nil {
						return fmt.Errorf("create: %w", err)
					}
					defer c.KillSandbox(context.WithoutCancel(ctx), sb.ID)
					res, err := c.Exec(ctx, sb.ID, space.ExecRequest{Cmd: []string{"true"}})
					if err != nil {
						return fmt.Errorf("exec: %w", err)
					}
					if res.ExitCode != 0 {
						return fmt.Errorf("exec: exit %d", res.ExitCode)
					}
					return c.KillSandbox(ctx, sb.ID)
				}()
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				if err != nil {
					failed.Add(1)
					if firstErr == nil {
						firstErr = err
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(float64(len(lat)-1)*q)] }
	fmt.Fprintf(a.stdout, "%d cycles, concurrency %d, %v: %.1f cycles/s; cycle latency p50 %v p99 %v max %v; %d errors\n",
		len(lat), concurrency, elapsed.Round(time.Millisecond), float64(len(lat))/elapsed.Seconds(),
		p(.5).Round(time.Millisecond), p(.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), failed.Load())
	if firstErr != nil {
		fmt.Fprintf(a.stderr, "first error: %v\n", firstErr)
	}
	leaks := 0
	if dataDir != "" {
		leaks = checkLeaks(ctx, a, c, dataDir)
	}
	if failed.Load() > 0 || leaks > 0 {
		return exitCode(1)
	}
	return nil
}

// checkLeaks looks on this host for anything a destroyed sandbox could
// leave: state dirs, mounts, cgroups of the data dir. Warm-pool sandboxes
// and sandboxes still alive are expected; everything beyond them is a leak.
func checkLeaks(ctx context.Context, a *app, c *space.Client, dataDir string) int {
	time.Sleep(2 * time.Second) // let the last destroys finish
	alive := 0
	if l, err := c.ListSandboxes(ctx, space.ListOptions{}); err == nil {
		alive = len(l.Sandboxes)
	}
	pooled := 0
	if m, err := httpGet(ctx, c.BaseURL()+"/metrics"); err == nil {
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, `space_sandboxes{state="pooled"} `) {
				fmt.Sscan(strings.TrimPrefix(l, `space_sandboxes{state="pooled"} `), &pooled)
			}
		}
	}
	expected := alive + pooled
	n := 0
	check := func(what string, items []string) {
		extra := len(items) - expected
		fmt.Fprintf(a.stdout, "leak check: %d %s (%d alive + %d warm expected)\n", len(items), what, alive, pooled)
		if extra > 0 {
			n += extra
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "sb-*"))
	check("sandbox state dirs", dirs)
	var cg []string
	for _, root := range []string{"/sys/fs/cgroup/memory/space", "/sys/fs/cgroup/space"} {
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), "sb-") {
				cg = append(cg, e.Name())
			}
		}
	}
	check("memory cgroups", cg)
	var procs []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(string(b), "runsc-sandbox") && strings.Contains(string(b), dataDir) {
			procs = append(procs, e.Name())
		}
	}
	check("runsc sandbox processes", procs)
	if n > 0 {
		fmt.Fprintf(a.stdout, "leak check: %d leaked\n", n)
	} else {
		fmt.Fprintf(a.stdout, "leak check: nothing leaked\n")
	}
	return n
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
