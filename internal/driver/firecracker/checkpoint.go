package firecracker

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Checkpoint image layout (a directory):
//
//	vm.state     Firecracker's microVM state file (devices, vCPUs)
//	memory       the guest memory, in full
//	rootfs.ext4  the sandbox's disk as of the checkpoint
//	vm.json      the machine record (vCPUs, memory, boot args, version)
//
// The snapshot records the drive's and vsock's paths relative to the VM's
// root (rootfs.ext4, v.sock), so a restore lays out a new root the same
// way and they resolve to the child's own files.
const (
	ckptState   = "vm.state"
	ckptMemory  = "memory"
	ckptDisk    = "rootfs.ext4"
	ckptMachine = "vm.json"
)

// Names of the snapshot files while Firecracker writes them, in its root.
const (
	snapStateTmp  = "ckpt.state"
	snapMemoryTmp = "ckpt.mem"
)

// Checkpoint implements driver.Checkpointer: the VM is paused (Firecracker
// snapshots only paused VMs), a Full snapshot is written, the disk (which
// the snapshot flushed) is copied, then the VM resumes (leaveRunning, if it
// was running) or is killed. Firecracker resets the guest's vsock
// connections at a snapshot, so the agent connection is closed first and
// no new one is made until the snapshot is done; callers redial.
func (i *Instance) Checkpoint(ctx context.Context, dir string, leaveRunning bool) (err error) {
	if i.machine.VCPU == 0 {
		return errdefs.Unavailable("firecracker: %s has no machine record; cannot checkpoint", i.id)
	}
	i.opMu.Lock()
	defer i.opMu.Unlock()
	i.gate.Lock()
	defer i.gate.Unlock()
	i.Detach()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	api := i.api()
	info, err := api.info(ctx)
	if err != nil {
		if i.exited() {
			return i.notRunning()
		}
		return err
	}
	switch info.State {
	case stateRunning:
		if err := api.do(ctx, http.MethodPatch, "/vm", vmState{State: statePaused}, nil); err != nil {
			return err
		}
	case statePaused:
	default:
		return errdefs.Conflict("firecracker: cannot checkpoint %s in state %q", i.id, info.State)
	}
	wasRunning := info.State == stateRunning
	tmpState, tmpMem := filepath.Join(i.root, snapStateTmp), filepath.Join(i.root, snapMemoryTmp)
	defer func() {
		os.Remove(tmpState)
		os.Remove(tmpMem)
		if err != nil && wasRunning {
			// Leave the VM as it was.
			if rerr := api.do(context.WithoutCancel(ctx), http.MethodPatch, "/vm", vmState{State: stateResumed}, nil); rerr != nil {
				i.log.Warn("resume after failed checkpoint", "err", rerr)
			}
		}
	}()
	if err := api.do(ctx, http.MethodPut, "/snapshot/create", snapshotCreate{
		SnapshotType: snapshotFull, SnapshotPath: snapStateTmp, MemFilePath: snapMemoryTmp,
	}, nil); err != nil {
		return err
	}
	// The snapshot flushed the disk to its file; the VM stays paused while
	// it is copied.
	if err := copyFile(ctx, filepath.Join(i.root, diskName), filepath.Join(dir, ckptDisk)); err != nil {
		return err
	}
	if err := moveFile(ctx, tmpState, filepath.Join(dir, ckptState)); err != nil {
		return fmt.Errorf("firecracker: checkpoint state: %w", err)
	}
	if err := moveFile(ctx, tmpMem, filepath.Join(dir, ckptMemory)); err != nil {
		return fmt.Errorf("firecracker: checkpoint memory: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, ckptMachine), i.machine); err != nil {
		return err
	}
	if !leaveRunning {
		i.mu.Lock()
		pid := i.pid
		i.mu.Unlock()
		return i.killPid(pid)
	}
	if wasRunning {
		return api.do(ctx, http.MethodPatch, "/vm", vmState{State: stateResumed}, nil)
	}
	return nil
}

// Restore implements driver.Restorer: a new VM (its own id, state dir,
// jail and copy of the checkpoint's disk) loading the snapshot, running
// when Restore returns. The guest memory is a hard link to the checkpoint's
// file, which Firecracker maps privately: siblings restored from one
// checkpoint share its unmodified pages, and the checkpoint directory may
// be removed afterwards. The guest's clock is behind by the time since the
// checkpoint: the caller sends the agent an Init with Time and Seed (the
// sandbox service does); Firecracker's VMGenID reseeds the kernel's RNG.
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, dir string) (_ driver.Instance, err error) {
	var m machine
	if err := readJSON(filepath.Join(dir, ckptMachine), &m); err != nil {
		return nil, errdefs.InvalidArgument("firecracker: %s is not a checkpoint image: %v", dir, err)
	}
	for _, f := range []string{ckptState, ckptMemory, ckptDisk} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, errdefs.InvalidArgument("firecracker: checkpoint image %s: %v", dir, err)
		}
	}
	if !idRE.MatchString(spec.ID) || spec.StateDir == "" || !filepath.IsAbs(spec.StateDir) {
		return nil, errdefs.InvalidArgument("firecracker: invalid id or state dir")
	}
	inst := d.newInstance(spec.ID, spec.StateDir)
	inst.machine = m
	inst.machine.Version = d.version
	inst.low = spec.LowPriority
	inst.started = true
	defer func() {
		if err != nil {
			_ = inst.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("firecracker: state dir: %w", err)
	}
	if err := inst.prepareRoot(); err != nil {
		return nil, err
	}
	if err := inst.copyIn(ctx, filepath.Join(dir, ckptDisk), diskName); err != nil {
		return nil, fmt.Errorf("firecracker: root disk: %w", err)
	}
	for _, f := range [][2]string{{ckptState, stateName}, {ckptMemory, memoryName}} {
		if err := inst.linkIn(ctx, filepath.Join(dir, f[0]), f[1]); err != nil {
			return nil, fmt.Errorf("firecracker: %s: %w", f[0], err)
		}
		if err := inst.own(filepath.Join(inst.root, f[1]), 0o600); err != nil {
			return nil, err
		}
	}
	if err := writeJSON(inst.machinePath(), inst.machine); err != nil {
		return nil, err
	}
	if err := inst.launch(ctx); err != nil {
		return nil, err
	}
	if err := inst.api().do(ctx, http.MethodPut, "/snapshot/load", snapshotLoad{
		SnapshotPath: stateName,
		MemBackend:   memBackend{BackendType: backendFile, BackendPath: memoryName},
		ResumeVM:     true,
	}, nil); err != nil {
		return nil, fmt.Errorf("firecracker: restore %s: %w (console: %s)", spec.ID, err, hostproc.TailFile(inst.consolePath(), 1500))
	}
	// Firecracker has read the state file and no longer needs it.
	_ = os.Remove(filepath.Join(inst.root, stateName))
	return inst, nil
}
