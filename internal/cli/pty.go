package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func (a *app) ptyCommand() *cobra.Command {
	var shell string
	cmd := &cobra.Command{
		Use:   "pty <id>",
		Short: "Open an interactive terminal in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			cols, rows := 80, 24
			in, isFile := a.stdin.(*os.File)
			tty := isFile && term.IsTerminal(int(in.Fd()))
			if tty {
				if w, h, err := term.GetSize(int(in.Fd())); err == nil {
					cols, rows = w, h
				}
			}
			ctx := cmd.Context()
			p, err := c.PTY(ctx, args[0], cols, rows, shell)
			if err != nil {
				return err
			}
			defer p.Close()
			if tty {
				old, err := term.MakeRaw(int(in.Fd()))
				if err != nil {
					return fmt.Errorf("raw mode: %w", err)
				}
				defer term.Restore(int(in.Fd()), old)
				stop := watchResize(func() {
					if w, h, err := term.GetSize(int(in.Fd())); err == nil {
						_ = p.Resize(w, h)
					}
				})
				defer stop()
			}
			go func() {
				// Ends when stdin does, or with the process (stdin left unread).
				_, _ = io.Copy(p, a.stdin)
			}()
			if _, err := io.Copy(a.stdout, p); err != nil {
				return err
			}
			code, err := p.Wait()
			if err != nil {
				return errors.New("terminal connection closed")
			}
			return exitCode(code)
		},
	}
	cmd.Flags().StringVar(&shell, "cmd", "", "program to run (default: the server's shell)")
	return cmd
}
