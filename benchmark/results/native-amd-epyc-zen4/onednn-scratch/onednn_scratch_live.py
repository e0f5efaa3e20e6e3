import sys,re,collections,subprocess
blocks=open(sys.argv[1],errors='replace').read().split('\nE\n')
live={}; 
for b in blocks:
    pass
    for line in b.split('\n'):
        if line.startswith('F '): live.pop(line.split()[1],None)
    if 'A 0x' in b:
        i=b.index('A 0x'); rest=b[i:].split('\n'); hdr=rest[0].split(); 
        if '625f5d2' in b:
            who=[l for l in rest[1:] if 'mxnet::op' in l or '_ZN5mxnet2op' in l]
            live[hdr[1]]=(int(hdr[2]), who[0].split('(')[1].split('+')[0] if who else '?')
c=collections.Counter(); n=collections.Counter()
for sz,w in live.values(): c[w]+=sz; n[w]+=1
names=list(c); dem=subprocess.run(['c++filt'],input='\n'.join(names),capture_output=True,text=True).stdout.split('\n')
for w,d in zip(names,dem): print('%7.1f MB %3d %s'%(c[w]/2**20,n[w],d[:100]))
print('total oneDNN-internal >=1MB live at end: %.1f MB'%(sum(c.values())/2**20))
