package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Checkpoint image layout (a directory):
//
//	memory      QEMU's migration stream: RAM and device state
//	disk.qcow2  the sandbox's overlay as of the checkpoint (backing file:
//	            the template image, which must outlive the checkpoint)
//	vm.json     the machine (accelerator, vCPUs, memory, kernel, initramfs,
//	            command line) a restore must reproduce exactly
//
// QEMU 7.2 has no file: migration, and QEMU may not spawn (seccomp
// spawn=deny; it runs as a uid that could not open the file anyway): the
// server opens memory and hands QEMU the descriptor, over the monitor
// (getfd, then `migrate fd:`) to save and as fd 5 (`-incoming fd:5`; 3
// and 4 are the disk's) to restore.
const (
	ckptMemory  = "memory"
	ckptDisk    = "disk.qcow2"
	ckptMachine = "vm.json"
)

// Checkpoint implements driver.Checkpointer: stop the vCPUs (QEMU drains
// and flushes the disk), migrate the machine state to dir/memory, copy the
// overlay, then resume (leaveRunning, if it was running) or kill the VM.
// The guest sees no connection break: the agent session survives.
func (i *Instance) Checkpoint(ctx context.Context, dir string, leaveRunning bool) error {
	if i.machine.Kernel == "" {
		return errdefs.Unavailable("qemu: %s has no machine record; cannot checkpoint", i.id)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	q, err := dialQMP(ctx, i.qmpSock())
	if err != nil {
		return err
	}
	defer q.Close()
	before, err := q.status(ctx)
	if err != nil {
		return err
	}
	// undo ends a checkpoint that failed: a migration still running is
	// cancelled and the VM runs again, over a connection of its own (q
	// may be the failure: a context that ended left it with a past
	// deadline, and QEMU serves one monitor client at a time), bounded
	// and whatever the caller's context. The VM stayed paused for good
	// when the client of a snapshot left while stop or the migration ran.
	undo := func(migrating bool) {
		if !leaveRunning || before != "running" {
			return
		}
		q.Close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		c, err := dialQMP(cctx, i.qmpSock())
		if err != nil {
			i.log.Warn("resume after a failed checkpoint", "err", err)
			return
		}
		defer c.Close()
		// The cut command may still run after this connection's first
		// (QEMU read it from the closed one): the VM counts as running
		// again once it was seen running for a while.
		steady := 0
		for steady < 4 {
			st, err := c.status(cctx)
			if err != nil {
				i.log.Warn("resume after a failed checkpoint", "err", err)
				return
			}
			if st == "running" {
				steady++
			} else {
				steady = 0
				if migrating {
					_ = c.execute(cctx, "migrate_cancel", nil, nil)
				}
				if err := c.execute(cctx, "cont", nil, nil); err != nil {
					i.log.Warn("resume after a failed checkpoint", "err", err)
				}
			}
			select {
			case <-cctx.Done():
				i.log.Warn("resume after a failed checkpoint: the VM did not stay running", "status", st)
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if err := q.execute(ctx, "stop", nil, nil); err != nil {
		undo(false) // QEMU may have stopped it all the same
		return err
	}
	resume := func() {
		if leaveRunning && before == "running" {
			if err := q.execute(context.WithoutCancel(ctx), "cont", nil, nil); err != nil {
				i.log.Warn("resume after checkpoint", "err", err)
			}
		}
	}
	if err := i.migrateTo(ctx, q, filepath.Join(dir, ckptMemory)); err != nil {
		undo(true)
		return err
	}
	// The migration inactivated (flushed) the disk: the overlay is exactly
	// what the saved memory state expects.
	if err := copyFile(ctx, i.diskPath(), filepath.Join(dir, ckptDisk)); err != nil {
		undo(false)
		return err
	}
	if err := writeJSON(filepath.Join(dir, ckptMachine), i.machine); err != nil {
		undo(false)
		return err
	}
	if !leaveRunning {
		_ = q.execute(ctx, "quit", nil, nil)
		return nil
	}
	resume()
	return nil
}

// ckptFD is the monitor's name of the descriptor a checkpoint streams to.
const ckptFD = "ckpt"

// migrateTo streams the stopped VM's state into file and waits for the end.
func (i *Instance) migrateTo(ctx context.Context, q *qmp, file string) error {
	// The default bandwidth cap (32 MiB/s) would make a 256 MiB guest
	// take seconds; the target is a local file.
	if err := q.execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	err = q.sendFD(ctx, ckptFD, f)
	f.Close() // QEMU holds its own copy
	if err != nil {
		return err
	}
	if err := q.execute(ctx, "migrate", map[string]any{"uri": "fd:" + ckptFD}, nil); err != nil {
		_ = q.execute(context.WithoutCancel(ctx), "closefd", map[string]any{"fdname": ckptFD}, nil)
		return err
	}
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.execute(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("qemu: checkpoint migration %s: %s (QEMU: %s)", st.Status, st.ErrorDesc, hostproc.TailFile(i.logPath(), 1500))
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			_ = q.execute(context.WithoutCancel(ctx), "migrate_cancel", nil, nil)
			return ctx.Err()
		}
	}
}

// Restore implements driver.Restorer: a new VM (its own id, state dir,
// sockets and a copy of the checkpoint's overlay) loading the checkpoint's
// machine state, running when Restore returns. The checkpoint directory is
// not needed afterwards. The guest's clock is behind by the time since the
// checkpoint and its RNG state is shared with every sibling: the caller
// sends the agent an Init with Time and Seed (the sandbox service does).
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, dir string) (_ driver.Instance, err error) {
	var m machine
	if err := readJSON(filepath.Join(dir, ckptMachine), &m); err != nil {
		return nil, errdefs.InvalidArgument("qemu: %s is not a checkpoint image: %v", dir, err)
	}
	if m.Accel != d.accel {
		return nil, errdefs.InvalidArgument("qemu: checkpoint was taken under %s, this host runs %s", m.Accel, d.accel)
	}
	if !idRE.MatchString(spec.ID) || spec.StateDir == "" || !filepath.IsAbs(spec.StateDir) {
		return nil, errdefs.InvalidArgument("qemu: invalid id or state dir")
	}
	inst := d.newInstance(spec.ID, spec.StateDir)
	inst.machine = m
	inst.low = spec.LowPriority
	inst.started = true
	defer func() {
		if err != nil {
			_ = inst.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu: state dir: %w", err)
	}
	if err := copyFile(ctx, filepath.Join(dir, ckptDisk), inst.diskPath()); err != nil {
		return nil, err
	}
	if err := writeJSON(inst.machinePath(), m); err != nil {
		return nil, err
	}
	mem, err := os.Open(filepath.Join(dir, ckptMemory))
	if err != nil {
		return nil, errdefs.InvalidArgument("qemu: %s is not a checkpoint image: %v", dir, err)
	}
	err = inst.launch(ctx, mem)
	mem.Close() // QEMU holds its own copy
	if err != nil {
		return nil, err
	}
	// QEMU runs the guest as soon as the incoming migration completes.
	q, err := dialQMP(ctx, inst.qmpSock())
	if err != nil {
		return nil, err
	}
	defer q.Close()
	for {
		st, err := q.status(ctx)
		if err != nil {
			return nil, err
		}
		switch st {
		case "running":
			return inst, nil
		case "inmigrate", "prelaunch":
		case "paused", "postmigrate":
			if err := q.execute(ctx, "cont", nil, nil); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("qemu: restore %s: vm status %q", spec.ID, st)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// copyFile copies src to dst, sharing blocks where the filesystem can
// (reflink) and keeping holes.
func copyFile(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %v: %s", filepath.Base(src), err, bytes.TrimSpace(out))
	}
	return nil
}
