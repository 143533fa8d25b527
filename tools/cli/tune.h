/* `clattn tune`: times candidate tiles on the device, writes a tuning file. */
#ifndef CLATTN_TOOLS_TUNE_H
#define CLATTN_TOOLS_TUNE_H

/* argv is the tool's whole command line (argv[1] = "tune"). */
int tune_main(int argc, char **argv);

extern const char tune_usage[];

#endif
