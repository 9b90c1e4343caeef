package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

type execFlags struct {
	env        []string
	cwd, user  string
	timeout    int
	background bool
	shell      string
	stdin      bool
}

func (a *app) execCommand() *cobra.Command {
	var fl execFlags
	cmd := &cobra.Command{
		Use:   "exec <id> [flags] -- <cmd> [args...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Long: "Run a command in a sandbox. Everything after -- is the argv (no shell: a single\n" +
			"argument with spaces stays one argument); use --shell 'a | b' for a shell line.\n" +
			"Exits with the command's exit code, 128+n when signal n ended it.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, req, err := buildExecRequest(args, cmd.ArgsLenAtDash(), fl)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			if fl.stdin {
				b, err := io.ReadAll(a.stdin)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				if !utf8.Valid(b) {
					// The API carries it as a JSON string: invalid bytes
					// would become U+FFFD, silently.
					return usageError(cmd, "--stdin: the input is not UTF-8 text (binary input: copy it in with `space cp` first)")
				}
				req.Stdin = string(b)
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			if fl.background {
				res, err := c.Exec(cmd.Context(), id, req)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, res.PID)
				return nil
			}
			return a.streamExec(cmd.Context(), c, id, req)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&fl.env, "env", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&fl.cwd, "cwd", "", "working directory")
	f.StringVar(&fl.user, "user", "", "user to run as")
	f.IntVar(&fl.timeout, "timeout", 0, "kill the command after this many seconds")
	f.BoolVar(&fl.background, "background", false, "start the command and print its pid without waiting")
	f.StringVar(&fl.shell, "shell", "", "run this shell command line instead of an argv")
	f.BoolVar(&fl.stdin, "stdin", false, "send this program's stdin (read to EOF first) to the command")
	return cmd
}

// buildExecRequest turns exec's positional args into a request. dash is the
// index of the first arg after "--" (-1 without "--"); the sandbox id must
// come before it.
func buildExecRequest(args []string, dash int, fl execFlags) (string, space.ExecRequest, error) {
	var req space.ExecRequest
	if dash == 0 || len(args) == 0 {
		return "", req, errors.New("missing sandbox id")
	}
	id := args[0]
	argv := args[1:]
	if dash > 1 {
		return "", req, fmt.Errorf("unexpected arguments before --: %s", strings.Join(args[1:dash], " "))
	}
	switch {
	case fl.shell != "" && len(argv) > 0:
		return "", req, errors.New("give either --shell or a command after --, not both")
	case fl.shell != "":
		req.Shell = fl.shell
	case len(argv) > 0:
		req.Cmd = argv
	default:
		return "", req, errors.New("missing command")
	}
	var err error
	if req.Env, err = parseKV("env", fl.env); err != nil {
		return "", req, err
	}
	req.Cwd, req.User, req.TimeoutS, req.Background = fl.cwd, fl.user, fl.timeout, fl.background
	return id, req, nil
}

// streamExec runs req with ExecStream, copying output as it arrives, and
// returns the command's exit status as an exitCode. SIGINT and SIGTERM
// received meanwhile are forwarded to the remote process; a second one stops
// waiting.
func (a *app) streamExec(ctx context.Context, c *space.Client, id string, req space.ExecRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// Signals are read from the start, also while the request connects: the
	// first is forwarded to the process, or, before the start event named
	// it, once it does (the server starts the process before it answers:
	// closing the stream would leave it running); a second stops waiting.
	pidc := make(chan int, 1)
	go func() {
		var pid int
		pending := ""
		send := func(name string) {
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer scancel()
			_ = c.Signal(sctx, id, pid, name)
		}
		forwarded := false
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-pidc:
				pid = p
				if pending != "" {
					send(pending)
					pending = ""
				}
			case sig := <-sigs:
				if forwarded {
					cancel()
					return
				}
				forwarded = true
				name := "SIGINT"
				if sig == syscall.SIGTERM {
					name = "SIGTERM"
				}
				if pid == 0 {
					pending = name
					continue
				}
				send(name)
			}
		}
	}()

	s, err := c.ExecStream(ctx, id, req)
	if err != nil {
		if ctx.Err() != nil {
			return exitCode(130)
		}
		var ae *space.APIError
		if errors.As(err, &ae) && ae.Code == space.CodeNotFound && strings.Contains(ae.Message, "executable file not found") {
			// The shell convention for "command not found".
			fmt.Fprintln(a.stderr, "space:", ae.Message)
			return exitCode(127)
		}
		return err
	}
	defer s.Close()

	for {
		ev, err := s.Next()
		if err != nil {
			if ctx.Err() != nil {
				return exitCode(130)
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the output stream ended before the command exited")
			}
			return err
		}
		switch ev.Type {
		case space.EventStart:
			pidc <- ev.PID
		case space.EventStdout:
			if _, err := a.stdout.Write(ev.Data); err != nil {
				return err
			}
		case space.EventStderr:
			if _, err := a.stderr.Write(ev.Data); err != nil {
				return err
			}
		case space.EventExit:
			if ev.Error != "" {
				fmt.Fprintf(a.stderr, "space: command ended: %s\n", ev.Error)
			}
			return exitCode(exitStatus(ev.ExitCode, ev.Signal))
		}
	}
}

// linuxSignals numbers the signals a sandbox (always Linux) can report, so
// the status is the same whatever OS the CLI runs on.
var linuxSignals = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17,
	"SIGCONT": 18, "SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22,
	"SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGVTALRM": 26, "SIGPROF": 27,
	"SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// exitStatus is the shell convention: the exit code, or 128+n when signal n
// ended the process. An unknown signal name counts as SIGKILL.
func exitStatus(code int, signal string) int {
	if signal == "" {
		return code
	}
	name := strings.ToUpper(signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n, ok := linuxSignals[name]; ok {
		return 128 + n
	}
	if n, err := strconv.Atoi(signal); err == nil && n > 0 && n < 128 {
		return 128 + n
	}
	return 128 + 9
}

func (a *app) psCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ps <id>",
		Short: "List a sandbox's processes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			procs, err := c.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			tw := newTable(a.stdout, "PID", "STATUS", "USER", "CWD", "STARTED", "COMMAND")
			for _, p := range procs {
				row(tw, strconv.Itoa(p.PID), procStatus(p), p.User, p.Cwd, fmtTime(p.StartedAt), strings.Join(p.Cmd, " "))
			}
			return tw.Flush()
		},
	}
}

func (a *app) commandsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "commands <id>",
		Short: "Show the commands started in a sandbox, oldest first (also after it stopped)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			tw := newTable(a.stdout, "ID", "STARTED", "PID", "STATUS", "COMMAND")
			for x, err := range c.AllCommands(cmd.Context(), args[0]) {
				if err != nil {
					return err
				}
				status := x.State
				if x.ExitCode != nil {
					status = "exited " + strconv.Itoa(*x.ExitCode)
					if *x.ExitCode < 0 {
						status = "killed"
					}
				}
				if x.Background {
					status += " (background)"
				}
				row(tw, strconv.FormatInt(x.ID, 10), x.StartedAt.Local().Format("2006-01-02 15:04:05.000"), strconv.Itoa(x.PID), status, strings.Join(x.Cmd, " "))
			}
			return tw.Flush()
		},
	}
}

func procStatus(p space.Process) string {
	switch {
	case p.Running:
		return "running"
	case p.Signal != "":
		return "killed " + p.Signal
	case p.ExitCode != nil:
		return "exited " + strconv.Itoa(*p.ExitCode)
	}
	return "exited"
}

func (a *app) logsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs <id> <pid>",
		Short: "Print a process's buffered output (with --follow, until it exits)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return usageError(cmd, "bad pid %q", args[1])
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			events := c.BufferedEvents
			if follow {
				events = c.Events
			}
			s, err := events(cmd.Context(), args[0], pid, -1)
			if err != nil {
				return err
			}
			defer s.Close()
			for {
				ev, err := s.Next()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				switch ev.Type {
				case space.EventStdout:
					if _, err := a.stdout.Write(ev.Data); err != nil {
						return err
					}
				case space.EventStderr:
					if _, err := a.stderr.Write(ev.Data); err != nil {
						return err
					}
				case space.EventTruncated:
					fmt.Fprintf(a.stderr, "space: output before event %d was dropped from the server's buffer\n", ev.Seq)
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing output until the process exits")
	return cmd
}
