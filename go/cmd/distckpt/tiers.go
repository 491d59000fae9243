package main

import (
	"encoding/json"
	"fmt"
	"strings"

	distckpt "distckpt.dev/go"
)

var tiersCommand = &command{
	name:    "tiers",
	args:    "[--json] [--prune-abandoned [--dry-run]] DIR",
	summary: "what a checkpoint manager's node-local tier holds: steps, parts, replicas, what restores from here",
	help: `
DIR is a CheckpointManager's local_dir on this node. For each step: whether it is complete (marked by its ranks),
whether this node alone could restore it (it holds every rank's part of one complete run), whether it is abandoned
(no marker, nothing in progress, and the run that wrote it has marked a newer step complete here); and each part with
its rank, kind (own: a rank of this node marked it; copy: a replica of another node's rank), size, run and state:
complete, in progress (being written or received), abandoned (its writer is gone) or damaged (why). Staging
directories are judged as prune judges leftovers: abandoned once their writer on this host has exited, or after an
hour idle for a writer elsewhere. Nothing is followed through a symbolic link; names that are not the manager's are
listed under "other".

--prune-abandoned removes abandoned staging directories and abandoned steps (never a step with a marker, anything in
progress, a link, or a name the manager does not write); --dry-run says what it would remove.

JSON: the core's document (docs/manager.md, "Looking at a tier"): {"schema_version": 1, "dir": str, "steps": [{"step": int,
  "complete": bool, "restorable_here": bool, "restorable_run": str, "abandoned": bool,
  "markers": [{"rank": int, "run": str}], "parts": [{"name": str, "rank": int|null, "ranks": int,
  "replica": bool|null, "run": str, "bytes": int, "state": str, "why": str}]}], "other": [str]}
With --prune-abandoned: {"schema_version": 1, "dir": str, "dry_run": bool, "removed": [str]}.`,
	run: runTiers,
}

type tierPart struct {
	Name  string `json:"name"`
	Rank  *int64 `json:"rank"`
	Ranks uint32 `json:"ranks"`
	// Replica is nil while the step has no marker (which ranks are this node's is unknown).
	Replica *bool  `json:"replica"`
	Run     string `json:"run"`
	Bytes   uint64 `json:"bytes"`
	State   string `json:"state"`
	Why     string `json:"why"`
}

type tierStep struct {
	Step           uint64     `json:"step"`
	Complete       bool       `json:"complete"`
	RestorableHere bool       `json:"restorable_here"`
	RestorableRun  string     `json:"restorable_run"`
	Abandoned      bool       `json:"abandoned"`
	Parts          []tierPart `json:"parts"`
}

type tierDoc struct {
	Dir   string     `json:"dir"`
	Steps []tierStep `json:"steps"`
	Other []string   `json:"other"`
}

func runTiers(c *ctx, args []string) int {
	fs := c.flags()
	prune := fs.Bool("prune-abandoned", false, "remove abandoned staging directories and abandoned steps")
	dry := fs.Bool("dry-run", false, "with --prune-abandoned: say what would be removed, remove nothing")
	pos, st := c.parse(fs, args, 1, 1)
	if st >= 0 {
		return st
	}
	dir := pos[0]
	if *dry && !*prune {
		return c.usageError("--dry-run goes with --prune-abandoned")
	}
	if *prune {
		removed := []string{}
		err := distckpt.PruneAbandonedTier(dir, *dry, func(p string) error {
			removed = append(removed, p)
			if !c.json {
				verb := "removed"
				if *dry {
					verb = "would remove"
				}
				fmt.Fprintf(c.stdout, "%s %s\n", verb, p)
			}
			return nil
		})
		if err != nil {
			return c.fail(err, dir)
		}
		if c.json {
			c.writeJSON(map[string]interface{}{"dir": dir, "dry_run": *dry, "removed": removed})
		} else if len(removed) == 0 {
			fmt.Fprintf(c.stdout, "nothing abandoned in %s\n", dir)
		}
		return exitOK
	}
	raw, err := distckpt.DescribeTier(dir)
	if err != nil {
		return c.fail(err, dir)
	}
	if c.json {
		c.writeJSON(json.RawMessage(raw))
		return exitOK
	}
	doc, err := parseTierDoc(raw)
	if err != nil {
		return c.fail(err, dir)
	}
	printTiers(c, doc)
	return exitOK
}

func parseTierDoc(raw []byte) (*tierDoc, error) {
	var doc tierDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("the core's tier document does not parse: %v", err)
	}
	return &doc, nil
}

// isManagerTier reports whether dir is a checkpoint manager's local tier holding at least one step (for ls, which
// finds no checkpoint there).
func isManagerTier(dir string) bool {
	raw, err := distckpt.DescribeTier(dir)
	if err != nil {
		return false
	}
	doc, err := parseTierDoc(raw)
	return err == nil && len(doc.Steps) > 0
}

func printTiers(c *ctx, doc *tierDoc) {
	if len(doc.Steps) == 0 {
		fmt.Fprintf(c.stdout, "no steps in the tier %s\n", doc.Dir)
	}
	for _, s := range doc.Steps {
		var notes []string
		if s.Complete {
			notes = append(notes, "complete")
		} else {
			notes = append(notes, "not complete")
		}
		if s.RestorableHere {
			notes = append(notes, "restorable from this node alone (run "+s.RestorableRun+")")
		}
		if s.Abandoned {
			notes = append(notes, "abandoned")
		}
		fmt.Fprintf(c.stdout, "step %d: %s\n", s.Step, strings.Join(notes, ", "))
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "  PART\tRANK\tOF\tKIND\tSIZE\tSTATE\tRUN")
		for _, p := range s.Parts {
			rank, of, kind := "-", "-", "-"
			if p.Rank != nil {
				rank = fmt.Sprint(*p.Rank)
			}
			if p.Ranks > 0 {
				of = fmt.Sprint(p.Ranks)
			}
			if p.Replica != nil {
				kind = map[bool]string{false: "own", true: "copy"}[*p.Replica]
			}
			state := p.State
			if p.Why != "" {
				state += ": " + p.Why
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, rank, of, kind, humanBytes(p.Bytes), state, p.Run)
		}
		tw.Flush()
	}
	if len(doc.Other) > 0 {
		fmt.Fprintf(c.stdout, "not the manager's (left alone): %s\n", strings.Join(doc.Other, ", "))
	}
}
