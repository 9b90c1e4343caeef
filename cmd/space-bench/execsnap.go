package main

import (
	"fmt"
	"time"
)

// snapshotOnExecRows measures what snapshot_on_exec adds to a command: the
// same shell commands in a sandbox created with it and in one without
// (the "raw" column here), once for a command that changes a file (a
// snapshot is kept) and once for one that changes nothing (a snapshot is
// taken, found equal to the previous one and dropped). Each sandbox's
// workspace is the template plus what these commands write: the files
// snapshot's cost grows with the writable layer (see the 1 GiB rows).
func (b *bench) snapshotOnExecRows(plain string, n int) error {
	var sb struct {
		ID string `json:"id"`
	}
	if code := b.do("POST", "/v1/sandboxes", map[string]any{"snapshot_on_exec": true, "timeout_s": 3600}, &sb); code != 201 {
		return fmt.Errorf("create with snapshot_on_exec: HTTP %d", code)
	}
	defer b.do("DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	run := func(id, cmd string) (time.Duration, error) {
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		t0 := time.Now()
		if code := b.do("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd}, &res); code != 200 || res.ExitCode != 0 {
			return 0, fmt.Errorf("exec %q: HTTP %d exit %d", cmd, code, res.ExitCode)
		}
		return time.Since(t0), nil
	}
	if _, err := run(sb.ID, "true"); err != nil { // the baseline snapshot before the first command
		return err
	}
	changed := row{name: "shell command writing a file, snapshot_on_exec", rawName: "the same, snapshot_on_exec off"}
	same := row{name: "shell command changing nothing, snapshot_on_exec", rawName: "the same, snapshot_on_exec off"}
	for i := 0; i < n; i++ {
		write := fmt.Sprintf("echo %d > /home/user/counter.txt", i)
		for _, c := range []struct {
			r   *row
			cmd string
		}{{&changed, write}, {&same, "true"}} {
			d, err := run(sb.ID, c.cmd)
			if err != nil {
				return err
			}
			c.r.space = append(c.r.space, d)
			if d, err = run(plain, c.cmd); err != nil {
				return err
			}
			c.r.raw = append(c.r.raw, d)
		}
	}
	b.rows = append(b.rows, changed, same)
	return nil
}
