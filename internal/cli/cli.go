// Package cli owns the `space` command line: one cobra command per verb, each
// parsing its flags and delegating to the public Go SDK (sdk/go) — the CLI
// reaches a server only through that client — or, for `space serve`, to
// server.Run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// Run runs the command line args (without the program name) and returns the
// process exit code.
func Run(args []string) int {
	return run(context.Background(), args, os.Stdin, os.Stdout, os.Stderr, os.Getenv)
}

// app is one invocation: its streams, environment and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	url, apiKey, dataDir string // global flags

	cfg    *clientConfig // resolved lazily, by commands that talk to a server
	client *space.Client
}

// exitCode is an error that only carries a process exit code; nothing is
// printed for it.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	fmt.Fprintf(stderr, "space: %s\n", a.explain(err))
	return 1
}

// explain adds a hint to errors whose cause is likely the local setup.
func (a *app) explain(err error) string {
	msg := err.Error()
	if space.IsUnauthenticated(err) && a.cfg != nil && a.cfg.Key == "" {
		msg += " (no API key: pass --api-key or set SPACE_API_KEY"
		if a.cfg.KeyErr != nil {
			msg += "; " + a.cfg.KeyErr.Error()
		}
		msg += ")"
	}
	return msg
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "space",
		Short:         "Sandboxes for AI agents",
		Long:          "space runs isolated sandboxes for AI agents. `space serve` runs the server; the other verbs talk to one.",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", "", "server URL (env SPACE_URL; default: from <data>/serve.json)")
	pf.StringVar(&a.apiKey, "api-key", "", "API key (env SPACE_API_KEY; default: <data>/api-key)")
	pf.StringVar(&a.dataDir, "data", "", "data directory of a local server (env SPACE_DATA; default /var/lib/space)")

	root.AddCommand(
		a.createCommand(),
		a.listCommand(),
		a.killCommand(),
		a.timeoutCommand(),
		a.metricsCommand(),
		a.pauseCommand(),
		a.resumeCommand(),
		a.forkCommand(),
		a.snapshotCommand(),
		a.snapshotsCommand(),
		a.diffCommand(),
		a.restoreCommand(),
		a.historyCommand(),
		a.snapshotCatCommand(),
		a.snapshotRmCommand(),
		a.execCommand(),
		a.psCommand(),
		a.commandsCommand(),
		a.logsCommand(),
		a.cpCommand(),
		a.lsCommand(),
		a.ptyCommand(),
		a.forwardCommand(),
		a.templateCommand(),
		a.poolsCommand(),
		a.keysCommand(),
		a.quotaCommand(),
		a.networkCommand(),
		a.egressCommand(),
		a.secretCommand(),
		a.healthCommand(),
		a.securityCommand(),
		a.benchCommand(),
		a.serveCommand(),
		a.versionCommand(),
	)
	return root
}

// sdk returns the client, resolving the server's URL and key on first use.
func (a *app) sdk() (*space.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	cfg, err := resolveClientConfig(a.url, a.apiKey, a.dataDir, a.getenv)
	a.cfg = &cfg
	if err != nil {
		return nil, err
	}
	a.client = space.NewClient(cfg.URL, cfg.Key, space.WithUserAgent("space-cli/"+version()))
	return a.client, nil
}

// usageError reports bad arguments.
func usageError(cmd *cobra.Command, format string, args ...any) error {
	return fmt.Errorf("%s (usage: %s)", fmt.Sprintf(format, args...), cmd.UseLine())
}
