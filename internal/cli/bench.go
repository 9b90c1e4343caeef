package cli

import (
	"context"
	"fmt"
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
	var ids []string
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
					mu.Lock()
					ids = append(ids, sb.ID)
					mu.Unlock()
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
		leaks = checkLeaks(ctx, a, c, dataDir, ids)
	}
	if failed.Load() > 0 || leaks > 0 {
		return exitCode(1)
	}
	return nil
}

// checkLeaks looks on this host for anything the churn's sandboxes could
// have left after their destroy: a state dir in the data dir, a cgroup, a
// runsc process, a mount, a record not stopped. Only the sandboxes this run
// created are checked, so other sandboxes and servers on the host do not
// count.
func checkLeaks(ctx context.Context, a *app, c *space.Client, dataDir string, ids []string) int {
	time.Sleep(2 * time.Second) // let the last destroys finish
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	var cmdlines []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.HasPrefix(string(b), "runsc") {
			cmdlines = append(cmdlines, string(b))
		}
	}
	cgroupRoots := []string{"/sys/fs/cgroup/space", "/sys/fs/cgroup/memory/space", "/sys/fs/cgroup/cpu/space", "/sys/fs/cgroup/pids/space"}
	var dirs, cgroups, procs, mnts, records int
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); err == nil {
			dirs++
		}
		for _, root := range cgroupRoots {
			if _, err := os.Stat(filepath.Join(root, id)); err == nil {
				cgroups++
			}
		}
		for _, cl := range cmdlines {
			if strings.Contains(cl, id) {
				procs++
			}
		}
		if strings.Contains(string(mounts), id) {
			mnts++
		}
		if sb, err := c.GetSandbox(ctx, id); err == nil && sb.State != "stopped" {
			records++
		}
	}
	n := dirs + cgroups + procs + mnts + records
	fmt.Fprintf(a.stdout, "leak check of %d destroyed sandboxes: %d state dirs, %d cgroups, %d runsc processes, %d mounts, %d records not stopped\n",
		len(ids), dirs, cgroups, procs, mnts, records)
	if n > 0 {
		fmt.Fprintf(a.stdout, "leak check: %d leaked\n", n)
	} else {
		fmt.Fprintf(a.stdout, "leak check: nothing leaked\n")
	}
	return n
}
