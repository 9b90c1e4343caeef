// Package driver owns the contract between the sandbox service and the
// isolation backends (gVisor, QEMU, Firecracker).
//
// The core is small: a Driver creates and recovers Instances; an Instance
// starts, pauses, resumes, hands back a connection to the guest agent, waits
// and is destroyed. Exec, files and ports are not driver methods: every driver
// runs the same guest agent (space-agent) and DialAgent returns a byte stream
// to it. Extras (checkpoint, restore) are optional interfaces announced in
// Capabilities and found by type assertion.
//
// A driver never imports the sandbox service; Spec is plain data with every
// path already resolved.
package driver

import (
	"context"
	"encoding/json"
	"io"
	"net"
)

// Driver creates sandboxes of one isolation technology.
type Driver interface {
	// Name is the driver's registry name ("gvisor", "qemu", "firecracker").
	Name() string
	// Capabilities reports what the driver can do on this host.
	Capabilities() Capabilities
	// Create prepares a sandbox (resources allocated, nothing running yet).
	// On error nothing is left behind. Errors: errdefs.ErrInvalidArgument
	// for a bad Spec, errdefs.ErrUnavailable when the host cannot run it.
	Create(ctx context.Context, spec Spec) (Instance, error)
	// Recover re-attaches to an instance created by an earlier process of
	// the server, from its persisted Handle. It returns errdefs.ErrNotFound
	// when the instance no longer exists on the host (its leftovers are
	// cleaned up before returning).
	Recover(ctx context.Context, h Handle) (Instance, error)
}

// Instance is one sandbox as the driver sees it.
type Instance interface {
	// ID is the sandbox id given in Spec.
	ID() string
	// Handle is the opaque, persisted record needed by Recover.
	Handle() Handle
	// Start boots the sandbox. ctx bounds the boot only, never the
	// sandbox's life. Errors: errdefs.ErrConflict if already started.
	Start(ctx context.Context) error
	// Pause freezes every process of the sandbox (no CPU used); Resume
	// thaws it. Both are idempotent. errdefs.ErrNotSupported if the driver
	// lacks CapPause.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// DialAgent returns a fresh byte stream to the guest agent, waiting
	// (bounded by ctx) until the agent is reachable. The caller owns the
	// connection; a broken connection is replaced by calling DialAgent again.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Wait blocks until the sandbox has stopped (or ctx is done) and
	// reports why.
	Wait(ctx context.Context) (ExitStatus, error)
	// Destroy stops the sandbox and frees everything it holds on the host
	// (processes, mounts, cgroups, files). It is idempotent and safe to call
	// on a half-created instance.
	Destroy(ctx context.Context) error
}

// ExitStatus tells why a sandbox stopped.
type ExitStatus struct {
	Reason string `json:"reason"` // "exited", "killed", "oom", "destroyed", "lost"
	Code   int    `json:"code"`
}

// Spec is everything a driver needs to create a sandbox. All paths are
// absolute and already resolved; drivers fetch nothing and apply no policy.
type Spec struct {
	ID       string `json:"id"`       // unique sandbox id, safe as a file name
	Hostname string `json:"hostname"` // guest hostname
	// Rootfs is the template's read-only root filesystem: a directory (gVisor)
	// or a raw disk image (VM drivers), as named by RootfsKind.
	Rootfs     string `json:"rootfs"`
	RootfsKind string `json:"rootfs_kind"` // "dir" or "raw"
	// StateDir is a directory owned by this instance alone: its writable
	// layer, sockets, logs and driver state live here, never in the template.
	StateDir string `json:"state_dir"`
	// AgentPath is the host path of the space-agent binary (static).
	AgentPath string `json:"agent_path"`
	// Resources.
	VCPU     int `json:"vcpu"`      // CPUs (gVisor: CFS quota of this many cores)
	MemoryMB int `json:"memory_mb"` // memory limit
	DiskMB   int `json:"disk_mb"`   // writable layer size limit (0: driver default)
	PidsMax  int `json:"pids_max"`  // process limit (0: driver default)
	// LowPriority starts the instance with the smallest CPU share, so a
	// warm pool's boots never slow the sandboxes already in use; a
	// Prioritizer gives it the normal share when it is handed out.
	LowPriority bool     `json:"low_priority,omitempty"`
	Env         []string `json:"env,omitempty"` // KEY=VALUE for the agent's environment
}

// Prioritizer is implemented by instances that honour Spec.LowPriority.
type Prioritizer interface {
	// Prioritize gives a low-priority instance the normal CPU share.
	Prioritize(ctx context.Context) error
}

// MemoryWatcher is implemented by instances whose host would stop the
// whole sandbox at its memory limit (gVisor: the host's OOM killer takes
// the sentry, and with it every process). Such a driver keeps the host's
// hard limit above the sandbox's memory and WatchMemory calls fn each
// time the sandbox's use reaches its memory, until ctx ends; the caller
// frees memory then (the agent kills the largest process, as a VM's own
// kernel would) and returns the bytes it expects freed (what the killed
// process held; 0 if nothing was killed), which the watch follows before
// it looks at the threshold again. A VM needs none of this: its kernel has
// an OOM killer.
type MemoryWatcher interface {
	WatchMemory(ctx context.Context, fn func() (freed int64)) error
}

// MemoryFloor is implemented by drivers that cannot run a sandbox with
// less memory than some size (a VM's kernel and agent): a create or a
// pool asking for less is refused before anything starts.
type MemoryFloor interface {
	MinMemoryMB() int
}

// Handle is the persisted, driver-specific record of an instance.
type Handle struct {
	Driver string          `json:"driver"`
	ID     string          `json:"id"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// StateDirHandle is the handle of the instance spec describes, known before
// the driver made it: every driver's Recover accepts a handle naming only
// the state dir (what it learns later, a pid, it reads from there). The
// service records it before a Restore, which makes and starts the instance
// in one call: a server that died during one left a VM or sandbox running
// that no record named.
func StateDirHandle(driverName string, spec Spec) Handle {
	data, _ := json.Marshal(map[string]string{"state_dir": spec.StateDir})
	return Handle{Driver: driverName, ID: spec.ID, Data: data}
}

// Capability names.
const (
	CapPause         = "pause"          // Pause/Resume
	CapCheckpoint    = "checkpoint"     // Checkpointer
	CapRestore       = "restore"        // Restorer
	CapFork          = "fork"           // checkpoint + many restores of one image
	CapFilesSnapshot = "files_snapshot" // UpperExporter: the writable layer without stopping
)

// Capabilities describes a driver on this host.
type Capabilities struct {
	Isolation string   `json:"isolation"` // "gvisor" (user-space kernel), "vm"
	Features  []string `json:"features"`  // Cap* names
	// Accelerator is the VM accelerator in use ("kvm", "tcg"), empty for gVisor.
	Accelerator string `json:"accelerator,omitempty"`
}

// Has reports whether the capability named f is present.
func (c Capabilities) Has(f string) bool {
	for _, x := range c.Features {
		if x == f {
			return true
		}
	}
	return false
}

// Detacher is implemented by instances that hold host-side handles (agent
// sockets, listeners) in the server process. Detach releases them without
// stopping the sandbox, as a server does on shutdown; a later Recover
// re-attaches. The instance value must not be used afterwards.
type Detacher interface {
	Detach()
}

// HandleDestroyer is implemented by drivers that can destroy what a handle
// names without asking it anything first: a kill must end an instance its
// driver cannot tell the state of (Recover not found nor found: a runsc or
// a monitor that does not answer). Not finding it is no error.
type HandleDestroyer interface {
	DestroyHandle(ctx context.Context, h Handle) error
}

// Checkpointer is implemented by instances that can save their full running
// state (memory, processes, writable layer) to a directory.
type Checkpointer interface {
	// Checkpoint writes the instance's state under dir. When leaveRunning
	// is false the instance is stopped afterwards.
	Checkpoint(ctx context.Context, dir string, leaveRunning bool) error
}

// UpperExporter is implemented by instances that can export their writable
// layer (changes against the template; deletions as overlay whiteouts) as a
// tar stream while running.
type UpperExporter interface {
	ExportUpper(ctx context.Context, w io.Writer) error
}

// ExportLimiter is implemented by UpperExporters that hold each file in
// memory while they export it (gVisor's tar of its writable layer): a file
// larger than ExportFileLimit, given the memory the guest uses now, would
// take the sandbox past its host memory limit and stop it.
type ExportLimiter interface {
	ExportFileLimit(memUsed int64) int64
}

// Restorer is implemented by drivers that can start a new instance from a
// checkpoint directory written by Checkpointer. The new instance is running
// when Restore returns.
type Restorer interface {
	Restore(ctx context.Context, spec Spec, checkpointDir string) (Instance, error)
}
